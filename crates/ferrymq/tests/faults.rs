//! The fault suite: the real `ferrymq serve` driven as a black box through crashes, a real full
//! file system, damaged segments and hostile input, seeded and replayable.
//!
//! Every test prints its seed (`fault suite seed: N`); `FERRYMQ_FAULTS_SEED=N` replays the same
//! choices (thread timing still differs between runs). The default run is short (what
//! `cargo test` and `.ci/run` run, well under a minute per test); the long run is
//!
//! ```text
//! FERRYMQ_FAULTS_SECS=3600 cargo test --release -p ferrymq --test faults -- --nocapture
//! ```
//!
//! which repeats the crash test with fresh seeds (and the damage test) until the time is up and
//! prints its figures. `FERRYMQ_FAULTS_BIN=<path>` tests another `ferrymq` binary.
//!
//! - `kill_and_term_under_mixed_load`: rounds of binary-protocol and HTTP publishers (batches of
//!   1 to 5 000 messages, each batch under one key so that it lands in one partition) and a
//!   consumer that acks (confirmed), nacks and lets messages time out, ended by SIGKILL or
//!   SIGTERM at a random moment. Checked at the end on the restarted broker: every acknowledged
//!   publish is readable at its id with its body; every batch in the log is whole and in order
//!   (a batch whose publisher never got its reply is there whole or not at all) and there once:
//!   every message carries a deduplication id, and a batch whose outcome a publisher did not
//!   learn is sent again by the next round's publisher, as an application would; each publisher's
//!   batches keep their order within a partition; offsets are dense; no message is delivered to
//!   the subscription again after its ack was confirmed; `/stats` counts what the log holds.
//!   After each restart a consumer of the subscription that existed before must receive a
//!   message published after the restart within `LIVENESS_DEADLINE` (`liveness_after_restart`
//!   checks the same in a run of its own).
//! - `a_small_file_system_fills_up_and_empties`: a 16 MiB tmpfs mounted by the test: publishes
//!   until the disk refuses them, then fills what is left so that the metadata store fails too;
//!   checks the refusals, `/status` (degraded, each fault with what to do), and that everything
//!   works again without a restart once the space is freed.
//! - `damaged_segments_are_reported_and_skipped`: byte flips in the bodies of closed segments and
//!   a truncated active segment: the damage is never served, a consumer's read reports it,
//!   `/status` names file, position and offsets, the sub command exits non-zero, `ferrymq topic
//!   skip-damaged` gets the subscription past it, and every other message is delivered intact.
//! - `hostile_input_leaves_the_broker_serving`: random and truncated frames, a thousand
//!   connections at once, a declared-oversize HTTP body; the broker answers `/status` and serves
//!   a normal publish and consume afterwards. `path_like_topic_names_never_reach_the_file_system`:
//!   `.`, `..` and other path-like names are refused over both transports and nothing outside
//!   `topics/` is touched.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{temp_dir, Served};
use ferrymq_client::{
    Client, ClientConfig, FsyncPolicy, Message, OffsetRange, OverflowPolicy, StartPosition,
    Storage, SubscribeOptions, TopicConfig,
};
use ferrymq_storage::SimRng;

const TOPIC: &str = "faults";
const WORK: &str = "work";
const AUDIT: &str = "audit";
const PARTITIONS: u32 = 3;
/// Rounds of the short run: enough kills of both kinds to meet recovery of a recovery.
const ROUNDS_SHORT: usize = 8;
/// A consumer of an existing subscription receives a message published after a restart within
/// this, or the broker stalled it.
const LIVENESS_DEADLINE: Duration = Duration::from_secs(15);
/// How long a round's clients may take to notice the broker is gone.
const ROUND_END_LIMIT: Duration = Duration::from_secs(15);
/// Bound on draining the log at the end.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

fn bin() -> String {
    std::env::var("FERRYMQ_FAULTS_BIN").unwrap_or_else(|_| common::BIN.to_string())
}

fn seed() -> u64 {
    let seed = match std::env::var("FERRYMQ_FAULTS_SEED") {
        Ok(seed) => seed.parse().expect("FERRYMQ_FAULTS_SEED is a number"),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            (nanos as u64) ^ ((std::process::id() as u64) << 32)
        }
    };
    println!("fault suite seed: {seed} (replay with FERRYMQ_FAULTS_SEED={seed})");
    seed
}

/// Seconds of the long run, if one was asked for.
fn long_run_secs() -> Option<u64> {
    std::env::var("FERRYMQ_FAULTS_SECS")
        .ok()
        .map(|s| s.parse().expect("FERRYMQ_FAULTS_SECS is a number"))
}

fn serve(data: &Path, extra: &[&str]) -> (Served, String, SocketAddr) {
    let mut args = vec![
        "--data-dir",
        data.to_str().unwrap(),
        "--tcp-addr",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let mut served = served_with_bin(&args);
    let tcp = served.tcp_addr().to_string();
    let http = served.http_addr();
    (served, tcp, http)
}

fn served_with_bin(args: &[&str]) -> Served {
    match std::env::var("FERRYMQ_FAULTS_BIN") {
        Ok(bin) => Served::start_bin(&bin, args, &[]),
        Err(_) => Served::start(args, &[]),
    }
}

fn client_config(addr: &str) -> ClientConfig {
    let mut config = ClientConfig::new(addr.to_string());
    config.connect_timeout = Duration::from_secs(5);
    config.request_timeout = Some(Duration::from_secs(10));
    config
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// One HTTP/1.1 request that never panics: `None` when the broker is not there (killed).
fn try_http(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Option<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let end = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&response[..end]).to_string();
    let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
    let mut body = response[end + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = common::dechunk(&body);
    }
    Some((status, body))
}

fn status(http: SocketAddr) -> (u16, serde_json::Value) {
    let (code, body) = try_http(http, "GET", "/status", b"").expect("GET /status answered");
    (
        code,
        serde_json::from_slice(&body).expect("/status is JSON"),
    )
}

fn ferrymq(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new(bin());
    command.args(args).stdin(Stdio::null());
    for (k, v) in envs {
        command.env(k, v);
    }
    command.output().expect("run ferrymq")
}

// ---------------------------------------------------------------------------------------------
// kill -9 and SIGTERM under mixed load

/// A message body: `<batch>|<index>|<count>|`, then padding. A batch id is `<publisher>-<seq>`.
fn body(batch: &str, index: usize, count: usize, pad: usize) -> String {
    format!("{batch}|{index}|{count}|{}", "p".repeat(pad))
}

fn parse_body(body: &[u8]) -> Option<(String, usize, usize)> {
    let text = std::str::from_utf8(body).ok()?;
    let mut parts = text.splitn(4, '|');
    let batch = parts.next()?.to_string();
    let index = parts.next()?.parse().ok()?;
    let count = parts.next()?.parse().ok()?;
    Some((batch, index, count))
}

/// What the clients saw, across every round.
#[derive(Default)]
struct Record {
    /// Acknowledged publishes: id to body.
    acked: HashMap<(u32, u64), Vec<u8>>,
    /// Every batch ever sent, with its size, acknowledged or not.
    sent: HashMap<String, usize>,
    /// Acks of `work` the broker confirmed.
    confirmed: HashSet<(u32, u64)>,
    /// Deliveries to `work` of a message whose ack had been confirmed before.
    redelivered_after_confirm: Vec<(u32, u64)>,
    /// Deliveries whose body was not one a publisher sent.
    foreign: Vec<String>,
    deliveries: u64,
    nacks: u64,
    /// Deliveries to `slow` after an ack deadline passed.
    timed_out_redeliveries: u64,
    /// Restarts after which the consumer of `work` did not get the probe in time.
    stalled_restarts: Vec<usize>,
    liveness_checked: usize,
    /// Per publisher, the batch whose outcome it does not know (the broker went before it
    /// answered): sent again with the same deduplication ids by the next round's publisher.
    in_doubt: HashMap<String, InDoubt>,
    /// Batches sent again after an unknown outcome, and those of them answered as duplicates
    /// (HTTP says so; the binary protocol's PUBLISHED does not).
    retried: u64,
    retried_found_stored: u64,
}

/// A batch sent without an answer: enough to send the same messages again.
#[derive(Clone)]
struct InDoubt {
    batch: String,
    count: usize,
    pad: usize,
}

impl InDoubt {
    /// Every message carries a deduplication id, so that a retry stores nothing twice.
    fn messages(&self) -> Vec<Message> {
        (0..self.count)
            .map(|i| {
                Message::new(body(&self.batch, i, self.count, self.pad))
                    .with_key(self.batch.clone())
                    .with_dedup_id(format!("{}|{i}", self.batch))
            })
            .collect()
    }

    fn json(&self) -> Vec<u8> {
        let messages: Vec<serde_json::Value> = (0..self.count)
            .map(|i| {
                serde_json::json!({
                    "body": body(&self.batch, i, self.count, self.pad),
                    "key": self.batch,
                    "dedup_id": format!("{}|{i}", self.batch),
                })
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({ "messages": messages })).unwrap()
    }
}

type Shared = Arc<Mutex<Record>>;

async fn binary_publisher(
    addr: String,
    publisher: u32,
    round: usize,
    record: Shared,
    mut rng: SimRng,
) {
    let Ok(client) = Client::connect_with(client_config(&addr)).await else {
        return;
    };
    let slot = format!("b{publisher}");
    let retry = record.lock().unwrap().in_doubt.get(&slot).cloned();
    if let Some(batch) = retry {
        record.lock().unwrap().retried += 1;
        if !publish_binary(&client, &slot, &batch, &record).await {
            return;
        }
    }
    for seq in 0.. {
        let count = match rng.below(20) {
            0 => 5000,
            1..=3 => 500 + rng.below(500) as usize,
            _ => 1 + rng.below(120) as usize,
        };
        let batch = InDoubt {
            batch: format!("b{publisher}r{round}s{seq}"),
            count,
            pad: rng.below(60) as usize,
        };
        record
            .lock()
            .unwrap()
            .sent
            .insert(batch.batch.clone(), count);
        if !publish_binary(&client, &slot, &batch, &record).await {
            return;
        }
    }
}

/// Publishes `batch`, in doubt until answered; false once the broker is gone.
async fn publish_binary(client: &Client, slot: &str, batch: &InDoubt, record: &Shared) -> bool {
    let messages = batch.messages();
    record
        .lock()
        .unwrap()
        .in_doubt
        .insert(slot.to_string(), batch.clone());
    let Ok(receipt) = client.publish_batch(TOPIC, None, &messages).await else {
        return false;
    };
    let mut record = record.lock().unwrap();
    record.in_doubt.remove(slot);
    for (id, message) in receipt.ids().zip(&messages) {
        record
            .acked
            .insert((id.partition, id.offset), message.body.to_vec());
    }
    true
}

/// Publishes JSON batches over HTTP, one request at a time, until the broker is gone; first the
/// batch the last round's HTTP publisher sent without an answer, if any.
fn http_publisher(http: SocketAddr, round: usize, record: Shared, mut rng: SimRng) {
    let retry = record.lock().unwrap().in_doubt.get("h").cloned();
    if let Some(batch) = retry {
        record.lock().unwrap().retried += 1;
        if !publish_http(http, &batch, &record) {
            return;
        }
    }
    for seq in 0.. {
        let count = 1 + rng.below(200) as usize;
        let batch = InDoubt {
            batch: format!("hr{round}s{seq}"),
            count,
            pad: rng.below(40) as usize,
        };
        record
            .lock()
            .unwrap()
            .sent
            .insert(batch.batch.clone(), count);
        if !publish_http(http, &batch, &record) {
            return;
        }
    }
}

/// Publishes `batch` over HTTP, in doubt until answered; false once the broker is gone.
fn publish_http(http: SocketAddr, batch: &InDoubt, record: &Shared) -> bool {
    record
        .lock()
        .unwrap()
        .in_doubt
        .insert("h".to_string(), batch.clone());
    let path = format!("/topics/{TOPIC}/messages");
    let Some((code, reply)) = try_http(http, "POST", &path, &batch.json()) else {
        return false;
    };
    if code != 201 {
        return false;
    }
    let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    let ids = reply["ids"].as_array().expect("ids");
    assert_eq!(ids.len(), batch.count, "one id per message: {reply}");
    let mut record = record.lock().unwrap();
    record.in_doubt.remove("h");
    if reply.get("duplicates").is_some() {
        record.retried_found_stored += 1;
    }
    for (i, id) in ids.iter().enumerate() {
        let (p, o) = id.as_str().unwrap().split_once('-').unwrap();
        record.acked.insert(
            (p.parse().unwrap(), o.parse().unwrap()),
            body(&batch.batch, i, batch.count, batch.pad).into_bytes(),
        );
    }
    true
}

fn work_options() -> SubscribeOptions {
    SubscribeOptions::new(TOPIC)
        .subscription(WORK)
        .start(StartPosition::Earliest)
        // Long enough that no ack is late: a late ack (after its deadline) is ignored and the
        // message delivered again, which is at-least-once, not a lost ack. Deadlines are
        // exercised by the `slow` subscription.
        .ack_timeout(Duration::from_secs(60))
        .max_attempts(1000)
        .credit(500)
}

/// Consumes `work`: acks most deliveries with confirmation, nacks some, leaves some to time out.
/// Ends when the broker is gone, or after `idle` without deliveries.
async fn consumer(addr: String, record: Shared, mut rng: SimRng, idle: Option<Duration>) {
    let Ok(client) = Client::connect_with(client_config(&addr)).await else {
        return;
    };
    let Ok(mut subscription) = client.subscribe(work_options()).await else {
        return;
    };
    // Acks confirmed before this consumer began: durable, so never delivered again.
    let durable = record.lock().unwrap().confirmed.clone();
    loop {
        let next = match idle {
            Some(idle) => match tokio::time::timeout(idle, subscription.next_batch()).await {
                Ok(next) => next,
                Err(_) => return,
            },
            None => subscription.next_batch().await,
        };
        let Some(Ok(batch)) = next else {
            return;
        };
        let mut ranges = Vec::new();
        let mut nacked = Vec::new();
        {
            let mut record = record.lock().unwrap();
            for delivery in batch.iter() {
                let id = (delivery.partition, delivery.offset);
                record.deliveries += 1;
                if durable.contains(&id) {
                    record.redelivered_after_confirm.push(id);
                }
                match parse_body(&delivery.message.body) {
                    Some((batch, _, _)) if record.sent.contains_key(&batch) => {}
                    _ if delivery.message.body.starts_with(b"probe-") => {}
                    _ => record
                        .foreign
                        .push(String::from_utf8_lossy(&delivery.message.body).to_string()),
                }
                let choice = if idle.is_some() { 0 } else { rng.below(20) };
                match choice {
                    0..=16 => ferrymq_client::push_offset(&mut ranges, id.0, id.1),
                    17 => nacked.push(OffsetRange::single(id.0, id.1)),
                    // Neither: it times out and comes again.
                    _ => {}
                }
            }
        }
        if !nacked.is_empty() {
            if subscription
                .nack_ranges(&nacked, Duration::ZERO)
                .await
                .is_err()
            {
                return;
            }
            record.lock().unwrap().nacks += nacked.len() as u64;
        }
        if !ranges.is_empty() {
            if subscription.ack_confirmed(&ranges).await.is_err() {
                return;
            }
            let mut record = record.lock().unwrap();
            for range in &ranges {
                for offset in range.offset..range.end() {
                    record.confirmed.insert((range.partition, offset));
                }
            }
        }
    }
}

/// Consumes the `slow` subscription and never acks: every message comes again after its short
/// ack deadline. Counts the redeliveries it sees.
async fn slow_consumer(addr: String, record: Shared) {
    let Ok(client) = Client::connect_with(client_config(&addr)).await else {
        return;
    };
    let options = SubscribeOptions::new(TOPIC)
        .subscription("slow")
        .start(StartPosition::Latest)
        .ack_timeout(Duration::from_millis(300))
        .max_attempts(1000)
        .credit(100);
    let Ok(mut subscription) = client.subscribe(options).await else {
        return;
    };
    while let Some(Ok(batch)) = subscription.next_batch().await {
        let again = batch.iter().filter(|d| d.attempt > 1).count() as u64;
        record.lock().unwrap().timed_out_redeliveries += again;
    }
}

/// After a restart: a consumer of `work` (which existed before) must get a message published
/// now, within the deadline, whatever backlog it has to pass first.
async fn liveness_probe(addr: &str, round: usize) -> bool {
    let Ok(client) = Client::connect_with(client_config(addr)).await else {
        return false;
    };
    let options = SubscribeOptions::new(TOPIC)
        .subscription(format!("live-{round}"))
        .start(StartPosition::Latest);
    // A subscription made before the restart is the one that stalls; `work` is drained by the
    // round's consumer, so the probe uses its own subscription from the previous round.
    let previous = SubscribeOptions::new(TOPIC)
        .subscription(format!("live-{}", round - 1))
        .start(StartPosition::Latest);
    let Ok(mut subscription) = client.subscribe(previous).await else {
        return false;
    };
    let probe = format!("probe-{round}");
    if client
        .publish(TOPIC, Message::new(probe.clone()).with_key("probe"))
        .await
        .is_err()
    {
        return false;
    }
    let deadline = tokio::time::Instant::now() + LIVENESS_DEADLINE;
    let alive = loop {
        match tokio::time::timeout_at(deadline, subscription.next()).await {
            Ok(Some(Ok(delivery))) if delivery.message.body == probe.as_bytes() => break true,
            // The previous round's load waits ahead of the probe: acked as it passes, so that
            // the credit window keeps the deliveries coming.
            Ok(Some(Ok(delivery))) => {
                let _ = subscription.ack(&delivery).await;
                continue;
            }
            _ => break false,
        }
    };
    // The next round's probe subscription, created only now: creating a subscription is not to
    // wake this one.
    if let Ok(s) = client.subscribe(options).await {
        let _ = s.close().await;
    }
    alive
}

struct CrashRun {
    kills: u64,
    terms: u64,
    acked: usize,
    batches_checked: usize,
    messages_checked: usize,
    deliveries: u64,
    nacks: u64,
    timed_out_redeliveries: u64,
    stalled_restarts: Vec<usize>,
    liveness_checked: usize,
    retried: u64,
    retried_found_stored: u64,
}

fn crash_run(seed: u64, rounds: usize, check_liveness: bool) -> CrashRun {
    let mut rng = SimRng::new(seed);
    let dir = temp_dir(&format!("faults-crash-{seed}"));
    let data = dir.join("data");
    let record: Shared = Arc::default();
    let (mut kills, mut terms) = (0, 0);
    let rt = runtime();
    for round in 0..rounds {
        let (mut served, tcp, http) = serve(&data, &["--segment-bytes", "262144"]);
        if round == 0 {
            rt.block_on(async {
                let client = Client::connect_with(client_config(&tcp)).await.unwrap();
                let config = TopicConfig {
                    partitions: PARTITIONS,
                    storage: Storage::Disk,
                    overflow: OverflowPolicy::Reject,
                    fsync: FsyncPolicy::Always,
                    // Longer than any run: every retry falls within the window.
                    dedup_window_ms: 24 * 3600 * 1000,
                    ..TopicConfig::default()
                };
                client.create_topic(TOPIC, config, false).await.unwrap();
                // Never consumes: retention keeps every segment for the final check.
                let audit = client
                    .subscribe(
                        SubscribeOptions::new(TOPIC)
                            .subscription(AUDIT)
                            .start(StartPosition::Earliest),
                    )
                    .await
                    .unwrap();
                drop(audit);
                let live = client
                    .subscribe(
                        SubscribeOptions::new(TOPIC)
                            .subscription("live-0")
                            .start(StartPosition::Latest),
                    )
                    .await
                    .unwrap();
                let _ = live.close().await;
            });
        } else {
            let alive = rt.block_on(liveness_probe(&tcp, round));
            let mut record = record.lock().unwrap();
            record.liveness_checked += 1;
            if !alive {
                record.stalled_restarts.push(round);
            }
            if check_liveness {
                assert!(
                    alive,
                    "seed {seed}: round {round}: a consumer of a subscription made before the restart got nothing published after it within {LIVENESS_DEADLINE:?}"
                );
            }
        }
        let load_ms = 300 + rng.below(1500);
        let seeds = [rng.next_u64(), rng.next_u64(), rng.next_u64()];
        let mut tasks: Vec<_> = (0..2u32)
            .map(|p| {
                rt.spawn(binary_publisher(
                    tcp.clone(),
                    p,
                    round,
                    record.clone(),
                    SimRng::new(seeds[p as usize]),
                ))
            })
            .collect();
        tasks.push(rt.spawn(slow_consumer(tcp.clone(), record.clone())));
        tasks.push(rt.spawn(consumer(
            tcp.clone(),
            record.clone(),
            SimRng::new(seeds[2]),
            None,
        )));
        let http_task = {
            let record = record.clone();
            let rng = SimRng::new(rng.next_u64());
            std::thread::spawn(move || http_publisher(http, round, record, rng))
        };
        std::thread::sleep(Duration::from_millis(load_ms));
        if rng.chance(1, 3) {
            served.signal("TERM");
            let exit = served.wait_exit();
            assert!(
                exit.success(),
                "seed {seed}: round {round}: SIGTERM exit {exit}"
            );
            terms += 1;
        } else {
            let _ = served.child.kill();
            let _ = served.child.wait();
            kills += 1;
        }
        rt.block_on(async {
            for task in tasks {
                tokio::time::timeout(ROUND_END_LIMIT, task)
                    .await
                    .unwrap_or_else(|_| panic!("seed {seed}: round {round}: a client did not end"))
                    .unwrap();
            }
        });
        http_task.join().unwrap();
        let panicked = served.seen.iter().any(|l| l.contains("panicked"));
        assert!(
            !panicked,
            "seed {seed}: the broker panicked:\n{}",
            served.seen.join("\n")
        );
    }

    // The last start: drain `work`, then read the whole log and check it against the clients.
    let (_served, tcp, http) = serve(&data, &["--segment-bytes", "262144"]);
    rt.block_on(consumer(
        tcp.clone(),
        record.clone(),
        SimRng::new(rng.next_u64()),
        Some(Duration::from_secs(3)),
    ));
    let log = rt.block_on(read_log(&tcp));
    let record = record.lock().unwrap();
    let what = format!("seed {seed}");
    // 1. Every acknowledged publish is readable at its id, with its body.
    for (id, body) in &record.acked {
        let got = log
            .get(id)
            .unwrap_or_else(|| panic!("{what}: acknowledged {id:?} is missing"));
        assert_eq!(got, body, "{what}: {id:?} has another body");
    }
    // 2. Every batch is whole, in order, in one partition, at consecutive offsets.
    let mut batches: BTreeMap<String, Vec<(u32, u64, usize, usize)>> = BTreeMap::new();
    for ((p, o), body) in &log {
        let Some((batch, index, count)) = parse_body(body) else {
            assert!(
                body.starts_with(b"probe-"),
                "{what}: foreign message at {p}-{o}"
            );
            continue;
        };
        batches
            .entry(batch)
            .or_default()
            .push((*p, *o, index, count));
    }
    let mut messages_checked = 0;
    for (batch, mut entries) in batches.iter_mut().map(|(b, e)| (b, std::mem::take(e))) {
        entries.sort();
        let count = record.sent.get(batch).copied();
        assert!(
            count.is_none_or(|count| entries.len() <= count),
            "{what}: batch {batch} is stored {} times: its retry was not recognised by its dedup ids",
            entries.len() as f64 / count.unwrap_or(1) as f64
        );
        assert_eq!(
            Some(entries[0].3),
            count,
            "{what}: batch {batch} was never sent so"
        );
        assert_eq!(
            entries.len(),
            entries[0].3,
            "{what}: batch {batch} is partial: {} of {}",
            entries.len(),
            entries[0].3
        );
        for (i, &(p, o, index, _)) in entries.iter().enumerate() {
            assert_eq!(p, entries[0].0, "{what}: batch {batch} spans partitions");
            assert_eq!(
                o,
                entries[0].1 + i as u64,
                "{what}: batch {batch} is not contiguous"
            );
            assert_eq!(index, i, "{what}: batch {batch} is out of order");
        }
        messages_checked += entries.len();
    }
    // 3. Each publisher's batches keep their order within a partition.
    let mut last_seq: HashMap<(u32, String), (u64, u64)> = HashMap::new();
    for ((p, o), body) in &log {
        let Some((batch, 0, _)) = parse_body(body) else {
            continue;
        };
        let (publisher, seq) = batch.rsplit_once('s').unwrap();
        let seq: u64 = seq.parse().unwrap();
        let round_key = (*p, publisher.to_string());
        if let Some(&(previous, at)) = last_seq.get(&round_key) {
            assert!(
                seq > previous,
                "{what}: {publisher} batch {seq} at {p}-{o} after {previous} at {at}"
            );
        }
        last_seq.insert(round_key, (seq, *o));
    }
    // 4. Confirmed acks stay acked; deliveries are messages someone sent.
    assert!(
        record.redelivered_after_confirm.is_empty(),
        "{what}: delivered again after a confirmed ack: {:?}",
        &record.redelivered_after_confirm[..record.redelivered_after_confirm.len().min(10)]
    );
    assert!(
        record.foreign.is_empty(),
        "{what}: unknown deliveries: {:?}",
        &record.foreign[..record.foreign.len().min(5)]
    );
    // 5. The broker's counts agree with the log.
    let (code, stats) = try_http(http, "GET", &format!("/topics/{TOPIC}"), b"").expect("describe");
    assert_eq!(code, 200);
    let stats: serde_json::Value = serde_json::from_slice(&stats).unwrap();
    assert_eq!(
        stats["messages"].as_u64(),
        Some(log.len() as u64),
        "{what}: {stats}"
    );
    let (code, health) = status(http);
    assert_eq!(code, 200, "{what}: {health}");
    drop(_served);
    let _ = std::fs::remove_dir_all(&dir);
    CrashRun {
        kills,
        terms,
        acked: record.acked.len(),
        batches_checked: batches.len(),
        messages_checked,
        deliveries: record.deliveries,
        nacks: record.nacks,
        timed_out_redeliveries: record.timed_out_redeliveries,
        stalled_restarts: record.stalled_restarts.clone(),
        liveness_checked: record.liveness_checked,
        retried: record.retried,
        retried_found_stored: record.retried_found_stored,
    }
}

/// Every message of the topic, by id, read from earliest through an ephemeral subscription.
async fn read_log(addr: &str) -> BTreeMap<(u32, u64), Vec<u8>> {
    let client = Client::connect_with(client_config(addr)).await.unwrap();
    let expected: u64 = client.describe_topic(TOPIC).await.unwrap().messages;
    let mut subscription = client
        .subscribe(
            SubscribeOptions::new(TOPIC)
                .ephemeral()
                .start(StartPosition::Earliest)
                .auto_ack(true)
                .credit(2000),
        )
        .await
        .unwrap();
    let mut log = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + DRAIN_LIMIT;
    while (log.len() as u64) < expected {
        let next = tokio::time::timeout_at(deadline, subscription.next_batch())
            .await
            .unwrap_or_else(|_| panic!("read {} of {expected} messages in time", log.len()));
        let batch = next
            .expect("stream open")
            .expect("no error reading the log");
        for delivery in batch.iter() {
            let previous = log.insert(
                (delivery.partition, delivery.offset),
                delivery.message.body.to_vec(),
            );
            assert!(
                previous.is_none(),
                "read twice: {}-{}",
                delivery.partition,
                delivery.offset
            );
        }
    }
    log
}

fn print_run(run: &CrashRun) {
    println!(
        "kills {} SIGTERMs {}; acknowledged publishes {}; batches checked whole {} ({} messages); deliveries {} (nacks {}, redelivered after an ack deadline {}); restarts checked for liveness {}, stalled {:?}; batches retried after an unknown outcome {} (HTTP retries answered as duplicates {})",
        run.kills, run.terms, run.acked, run.batches_checked, run.messages_checked, run.deliveries, run.nacks, run.timed_out_redeliveries, run.liveness_checked, run.stalled_restarts, run.retried, run.retried_found_stored
    );
}

#[test]
fn kill_and_term_under_mixed_load() {
    let seed = seed();
    let Some(secs) = long_run_secs() else {
        print_run(&crash_run(seed, ROUNDS_SHORT, true));
        return;
    };
    let end = Instant::now() + Duration::from_secs(secs);
    let mut seed = seed;
    let (mut runs, mut kills, mut terms, mut acked, mut messages, mut stalled, mut checked) =
        (0, 0, 0, 0, 0, 0, 0);
    let mut retried = 0;
    while Instant::now() < end {
        let run = crash_run(seed, 20, true);
        print_run(&run);
        runs += 1;
        kills += run.kills;
        terms += run.terms;
        acked += run.acked;
        messages += run.messages_checked;
        stalled += run.stalled_restarts.len();
        checked += run.liveness_checked;
        retried += run.retried;
        seed = SimRng::new(seed).next_u64();
        println!("next seed: {seed}");
    }
    println!(
        "long run: {runs} runs, {kills} kills, {terms} SIGTERMs, {acked} acknowledged publishes all readable, {messages} messages checked in whole batches, none stored twice ({retried} batches retried after an unknown outcome), {stalled} of {checked} restarts stalled a consumer"
    );
}

#[test]
fn liveness_after_restart() {
    let seed = seed();
    print_run(&crash_run(seed, 4, true));
}

// ---------------------------------------------------------------------------------------------
// a real small file system that fills up and empties

/// Unmounts the file system however the test ends.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Mounts a tmpfs of `size` on `dir`; `None` where mounting is not allowed (not root).
fn mount_tmpfs(dir: &Path, size: &str) -> Option<Mount> {
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    mounted.then(|| Mount(dir.to_path_buf()))
}

/// Writes zeros to `path` until the file system is full; returns the bytes written.
fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    let mut written = 0u64;
    // Bounded by the file system's size (16 MiB here).
    loop {
        match file.write(&chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => written += n as u64,
        }
    }
    let _ = file.sync_all();
    // Smaller writes take what a 64 KiB one could not.
    for size in [4096usize, 512, 1] {
        while file.write(&chunk[..size]).is_ok_and(|n| n > 0) {
            written += size as u64;
        }
    }
    written
}

fn faults_of(health: &serde_json::Value) -> Vec<String> {
    health["faults"]
        .as_array()
        .map(|faults| {
            faults
                .iter()
                .map(|f| f["kind"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_small_file_system_fills_up_and_empties() {
    let seed = seed();
    let mut rng = SimRng::new(seed);
    let dir = temp_dir("faults-fs");
    let Some(_mount) = mount_tmpfs(&dir, "16m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root); crates/ferrymq-broker/tests/disk.rs covers a full disk and a failing metadata store with injected faults");
        return;
    };
    let data = dir.join("data");
    let (mut served, tcp, http) = serve(&data, &["--segment-bytes", "262144"]);
    let rt = runtime();
    let client = rt
        .block_on(Client::connect_with(client_config(&tcp)))
        .unwrap();
    let disk_topic = TopicConfig {
        storage: Storage::Disk,
        fsync: FsyncPolicy::Always,
        ..TopicConfig::default()
    };
    rt.block_on(client.create_topic("fill", disk_topic.clone(), false))
        .unwrap();
    let mut subscription = rt
        .block_on(
            client.subscribe(
                SubscribeOptions::new("fill")
                    .subscription("s")
                    .start(StartPosition::Earliest),
            ),
        )
        .unwrap();

    // Space set aside now and freed at the end, so that freeing it leaves room for more than
    // the few writes that find the disk healthy again.
    let reserve = dir.join("reserve");
    std::fs::write(&reserve, vec![1u8; 3 << 20]).unwrap();
    // Publish until the disk refuses: a clear storage error, never a hang.
    let body = vec![b'x'; 2048 + rng.below(2048) as usize];
    let mut published = 0u64;
    let refusal = loop {
        assert!(published < 20_000, "16 MiB never filled");
        let batch: Vec<Message> = (0..16).map(|_| Message::new(body.clone())).collect();
        match rt.block_on(client.publish_batch("fill", None, &batch)) {
            Ok(_) => published += 16,
            Err(error) => break error,
        }
    };
    assert_eq!(
        refusal.code(),
        Some(ferrymq_client::ErrorCode::StorageUnavailable),
        "{refusal}"
    );
    let (code, health) = status(http);
    assert_eq!(code, 503, "{health}");
    assert_eq!(health["status"], "degraded");
    assert!(
        faults_of(&health).contains(&"partition_writes".to_string()),
        "{health}"
    );
    assert!(
        health["faults"][0]["action"]
            .as_str()
            .unwrap()
            .contains("free space"),
        "{health}"
    );
    let (_, metrics) = try_http(http, "GET", "/metrics", b"").unwrap();
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(
        metrics.contains("ferrymq_faults{kind=\"partition_writes\"} 1"),
        "{metrics}"
    );

    // Take every byte left, so that the metadata store cannot commit either.
    let filler = dir.join("filler");
    fill(&filler);
    // Reads go on; an ack or a topic may or may not find room in the store's file, but the
    // broker answers, and says what is wrong.
    let delivered = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(10), subscription.next()).await
        })
        .expect("reads go on while the disk is full")
        .unwrap()
        .unwrap();
    let acked = rt.block_on(
        subscription.ack_confirmed(&[OffsetRange::single(delivered.partition, delivered.offset)]),
    );
    let created = rt.block_on(client.create_topic("while-full", disk_topic.clone(), false));
    let (code, health) = status(http);
    assert_eq!(code, 503, "{health}");
    println!(
        "full: ack {}, topic creation {}, faults {:?}",
        if acked.is_ok() { "saved" } else { "refused" },
        if created.is_ok() { "done" } else { "refused" },
        faults_of(&health)
    );
    if acked.is_err() || created.is_err() {
        let error = acked.err().or(created.err()).unwrap();
        assert_eq!(
            error.code(),
            Some(ferrymq_client::ErrorCode::StorageUnavailable),
            "{error}"
        );
    }

    // Space comes back: everything works again without a restart.
    std::fs::remove_file(&filler).unwrap();
    std::fs::remove_file(&reserve).unwrap();
    let mut resumed = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let batch = [Message::new(body.clone())];
        if rt
            .block_on(client.publish_batch("fill", None, &batch))
            .is_ok()
            && status(http).0 == 200
        {
            resumed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Deleting acked data is what frees a full disk in practice; here the filler did.
    assert!(
        resumed,
        "not healthy 20 s after space was freed: {}",
        status(http).1
    );
    rt.block_on(client.create_topic("after-full", disk_topic, true))
        .unwrap();
    let next = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(10), subscription.next()).await
        })
        .unwrap()
        .unwrap()
        .unwrap();
    rt.block_on(subscription.ack_confirmed(&[OffsetRange::single(next.partition, next.offset)]))
        .unwrap();
    assert!(
        served.child.try_wait().unwrap().is_none(),
        "the broker stayed up"
    );
    drop(subscription);
    drop(client);
    served.signal("TERM");
    assert!(served.wait_exit().success());
}

// ---------------------------------------------------------------------------------------------
// byte flips and truncations in segments

fn segment_files(partition: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(partition)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs
}

fn lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn damage_run(seed: u64) {
    let mut rng = SimRng::new(seed);
    let what = format!("seed {seed}");
    let dir = temp_dir(&format!("faults-damage-{seed}"));
    let data = dir.join("data");
    let (mut served, tcp, _) = serve(&data, &["--segment-bytes", "16384"]);
    let env = [("FERRYMQ_ADDR", tcp.as_str())];
    let created = ferrymq(&["topic", "create", "d", "--storage", "disk"], &env);
    assert!(created.status.success(), "{created:?}");
    // The subscription exists before the damage and has read nothing.
    let sub = ferrymq(
        &[
            "sub",
            "d",
            "--subscription",
            "s",
            "--from",
            "earliest",
            "--timeout",
            "200ms",
        ],
        &env,
    );
    assert!(sub.status.success(), "{sub:?}");
    let batches = 40 + rng.below(20) as usize;
    let batch_size = 20;
    let bodies: Vec<String> = (0..batches * batch_size)
        .map(|i| format!("d-{i:05}-{}", "q".repeat(40)))
        .collect();
    let rt = runtime();
    rt.block_on(async {
        let client = Client::connect_with(client_config(&tcp)).await.unwrap();
        for chunk in bodies.chunks(batch_size) {
            let messages: Vec<Message> = chunk.iter().map(|b| Message::new(b.clone())).collect();
            client.publish_batch("d", None, &messages).await.unwrap();
        }
    });
    served.signal("TERM");
    assert!(served.wait_exit().success(), "{what}");

    // A flipped byte in a body near the start of a closed segment (before its last index
    // point, so that open does not scan it: a read finds it).
    let partition = data.join("topics/d/0");
    let segments = segment_files(&partition);
    assert!(segments.len() >= 4, "{what}: {} segments", segments.len());
    let damaged_file = segments[rng.below(segments.len() as u64 - 2) as usize].clone();
    let mut bytes = std::fs::read(&damaged_file).unwrap();
    let candidates: Vec<(usize, usize)> = bodies
        .iter()
        .enumerate()
        .filter_map(|(i, b)| {
            let at = bytes.windows(b.len()).position(|w| w == b.as_bytes())?;
            (at < 3000).then_some((i, at))
        })
        .collect();
    assert!(
        !candidates.is_empty(),
        "{what}: no body early in {}",
        damaged_file.display()
    );
    let (damaged_index, at) = candidates[rng.below(candidates.len() as u64) as usize];
    bytes[at + 2 + rng.below(5) as usize] ^= 1 << rng.below(8);
    std::fs::write(&damaged_file, bytes).unwrap();
    // A torn tail of the active segment: its last batch loses a few bytes.
    let active = segments.last().unwrap();
    // Past the entries a stopped broker may leave zeros (room kept for syncs): the cut is
    // counted from the last entry's end, the last byte that is not zero (bodies end in 'q').
    let content = std::fs::read(active).unwrap();
    let len = content.iter().rposition(|&b| b != 0).unwrap() as u64 + 1;
    let cut = 1 + rng.below(200);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(active)
        .unwrap();
    file.set_len(len - cut).unwrap();
    drop(file);

    let (mut served, tcp, http) = serve(&data, &["--segment-bytes", "16384"]);
    let http_text = http.to_string();
    let env = [
        ("FERRYMQ_ADDR", tcp.as_str()),
        ("FERRYMQ_HTTP_ADDR", http_text.as_str()),
    ];
    assert!(
        served
            .seen
            .iter()
            .any(|l| l.contains("truncating a torn tail")),
        "{what}: the cut is logged:\n{}",
        served.seen.join("\n")
    );
    assert_eq!(status(http).0, 200, "{what}");
    // The last batch was torn: it is gone whole.
    let kept = bodies.len() - batch_size;

    // The consumer reads up to the damage, then the broker reports it and `sub` fails.
    let first = ferrymq(
        &["sub", "d", "--subscription", "s", "--timeout", "2s"],
        &env,
    );
    assert!(
        !first.status.success(),
        "{what}: sub exits non-zero on a server error"
    );
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(stderr.contains("skip-damaged"), "{what}: {stderr}");
    let before = lines(&first);
    assert_eq!(
        before,
        bodies[..damaged_index].to_vec(),
        "{what}: what came before the damage"
    );
    let (code, health) = status(http);
    assert_eq!(code, 503, "{what}: {health}");
    let fault = &health["faults"][0];
    assert_eq!(fault["kind"], "unreadable_range", "{what}: {health}");
    assert_eq!(
        fault["file"],
        damaged_file.to_str().unwrap(),
        "{what}: {health}"
    );
    assert_eq!(
        fault["first_offset"], damaged_index as u64,
        "{what}: {health}"
    );
    assert!(fault["position"].as_u64().is_some(), "{what}: {health}");
    assert!(
        fault["action"].as_str().unwrap().contains("skip-damaged"),
        "{what}"
    );
    let (_, metrics) = try_http(http, "GET", "/metrics", b"").unwrap();
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(
        metrics.contains("ferrymq_faults{kind=\"unreadable_range\"} 1"),
        "{what}"
    );
    // A status lookup of the damaged message names the damage.
    let id = format!("0-{damaged_index}");
    let lookup = ferrymq(&["status", "d", &id], &env);
    assert!(!lookup.status.success(), "{what}");
    let stderr = String::from_utf8_lossy(&lookup.stderr);
    assert!(stderr.contains("damaged"), "{what}: {stderr}");

    // The operator skips it; the subscription gets everything after it, intact.
    let skip = ferrymq(&["topic", "skip-damaged", "d", "--partition", "0"], &env);
    assert!(skip.status.success(), "{what}: {skip:?}");
    let said = String::from_utf8_lossy(&skip.stdout);
    assert!(
        said.contains(&format!("skipped offsets {damaged_index}..")),
        "{what}: {said}"
    );
    assert_eq!(status(http).0, 200, "{what}: {}", status(http).1);
    let second = ferrymq(
        &["sub", "d", "--subscription", "s", "--timeout", "2s"],
        &env,
    );
    assert!(second.status.success(), "{what}: {second:?}");
    let after = lines(&second);
    assert_eq!(
        after,
        bodies[damaged_index + 1..kept].to_vec(),
        "{what}: what came after"
    );
    served.signal("TERM");
    assert!(served.wait_exit().success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn damaged_segments_are_reported_and_skipped() {
    let seed = seed();
    match long_run_secs() {
        None => damage_run(seed),
        Some(secs) => {
            let end = Instant::now() + Duration::from_secs(secs);
            let (mut seed, mut runs) = (seed, 0);
            while Instant::now() < end {
                damage_run(seed);
                runs += 1;
                seed = SimRng::new(seed).next_u64();
            }
            println!("damage runs: {runs}, each reported, skipped and read past");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// hostile input

/// Every golden frame of `protocol/vectors.json`, valid and invalid, as bytes.
fn golden_frames() -> Vec<Vec<u8>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../protocol/vectors.json");
    let vectors: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("protocol/vectors.json")).unwrap();
    let mut frames = Vec::new();
    for group in ["vectors", "invalid"] {
        for v in vectors[group].as_array().unwrap() {
            // A well-formed user, grant or token request (opcodes 0x50-0x58) from an anonymous
            // client of a broker without users is obeyed, not hostile: it would turn
            // authentication on and change what the rest of the suite may do.
            if (0x50..=0x58).contains(&v["opcode"].as_u64().unwrap_or(0)) {
                continue;
            }
            if let Some(hex) = v["hex"].as_str() {
                let bytes = (0..hex.len() / 2)
                    .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                    .collect();
                frames.push(bytes);
            }
        }
    }
    frames
}

/// Sends `bytes` on a fresh connection and reads until the broker closes it or goes quiet.
fn send_and_drain(addr: &str, bytes: &[u8]) {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        panic!("the broker stopped accepting connections");
    };
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let _ = stream.write_all(bytes);
    let mut buf = [0u8; 4096];
    // Bounded: at most 64 reads of a reply, each waiting at most 300 ms.
    for _ in 0..64 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

#[test]
fn hostile_input_leaves_the_broker_serving() {
    let seed = seed();
    let mut rng = SimRng::new(seed);
    let what = format!("seed {seed}");
    let dir = temp_dir("faults-hostile");
    let (mut served, tcp, http) = serve(&dir.join("data"), &[]);

    // Random bytes, golden frames cut short or with a byte changed, frames glued together.
    let frames = golden_frames();
    for _ in 0..300 {
        let mut bytes = match rng.below(4) {
            0 => (0..rng.below(200)).map(|_| rng.next_u64() as u8).collect(),
            1 => {
                let f = &frames[rng.below(frames.len() as u64) as usize];
                f[..rng.below(f.len() as u64 + 1) as usize].to_vec()
            }
            2 => {
                let mut f = frames[rng.below(frames.len() as u64) as usize].clone();
                let at = rng.below(f.len() as u64) as usize;
                f[at] = rng.next_u64() as u8;
                f
            }
            _ => {
                let hello = frames[0].clone();
                let f = &frames[rng.below(frames.len() as u64) as usize];
                [hello, f.clone()].concat()
            }
        };
        if rng.chance(1, 4) {
            bytes.extend((0..rng.below(64)).map(|_| rng.next_u64() as u8));
        }
        send_and_drain(&tcp, &bytes);
    }

    // Two thousand connections at once, each silent, then gone.
    let mut open = Vec::new();
    for _ in 0..2000 {
        match TcpStream::connect(&tcp) {
            Ok(stream) => open.push(stream),
            Err(error) => panic!("{what}: connection {} refused: {error}", open.len()),
        }
    }
    assert!(
        try_http(http, "GET", "/status", b"").is_some(),
        "{what}: HTTP answers meanwhile"
    );
    drop(open);

    // An HTTP body that claims a gigabyte and sends a few bytes; a raw body past the message
    // limit; a request head of garbage.
    if let Ok(mut stream) = TcpStream::connect(http) {
        let _ = stream.write_all(
            b"POST /topics/h/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000000000\r\n\r\nabc",
        );
    }
    let big = vec![b'z'; 300 * 1024];
    let (code, _) = try_http(http, "POST", "/topics/h/messages?raw=1", &big).expect("answered");
    assert!(
        (400..500).contains(&code),
        "{what}: a body past the limit got {code}"
    );
    send_and_drain(&http.to_string(), b"\x00\x01GARBAGE / HTTP/9\r\n\r\n");

    // Still serving: health, a publish and a consume.
    let (code, health) = status(http);
    assert_eq!(code, 200, "{what}: {health}");
    let env = [("FERRYMQ_ADDR", tcp.as_str())];
    let publish = ferrymq(&["pub", "after-hostile", "still here"], &env);
    assert!(publish.status.success(), "{what}: {publish:?}");
    let consume = ferrymq(
        &[
            "sub",
            "after-hostile",
            "--from",
            "earliest",
            "--count",
            "1",
            "--timeout",
            "5s",
        ],
        &env,
    );
    assert_eq!(lines(&consume), ["still here"], "{what}: {consume:?}");
    assert!(
        served.child.try_wait().unwrap().is_none(),
        "{what}: the broker exited"
    );
    served.signal("TERM");
    assert!(served.wait_exit().success());
    assert!(
        !served.seen.iter().any(|l| l.contains("panicked")),
        "{what}: {}",
        served.seen.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn path_like_topic_names_never_reach_the_file_system() {
    let dir = temp_dir("faults-names");
    let data = dir.join("data");
    let (mut served, tcp, http) = serve(&data, &[]);
    let env = [("FERRYMQ_ADDR", tcp.as_str())];
    assert!(ferrymq(&["pub", "keep", "kept"], &env).status.success());
    for name in [".", "..", "", "a/b", "..%2F..", "%2E%2E"] {
        let body = serde_json::to_vec(&serde_json::json!({ "name": name })).unwrap();
        let (code, reply) = try_http(http, "POST", "/topics", &body).expect("answered");
        assert_eq!(
            code,
            400,
            "topic name {name:?}: {}",
            String::from_utf8_lossy(&reply)
        );
        let cli = ferrymq(&["topic", "create", name, "--storage", "disk"], &env);
        assert!(
            !cli.status.success(),
            "topic name {name:?} accepted by the binary protocol"
        );
    }
    for path in ["/topics/%2E%2E", "/topics/%2E", "/topics/.."] {
        let _ = try_http(http, "DELETE", path, b"");
    }
    assert!(data.join("meta.redb").exists(), "the data dir survived");
    assert_eq!(status(http).0, 200);
    served.signal("TERM");
    assert!(served.wait_exit().success());
    let (_served, tcp, _) = serve(&data, &[]);
    let env = [("FERRYMQ_ADDR", tcp.as_str())];
    let consume = ferrymq(
        &[
            "sub",
            "keep",
            "--from",
            "earliest",
            "--count",
            "1",
            "--timeout",
            "5s",
        ],
        &env,
    );
    assert_eq!(lines(&consume), ["kept"]);
    let _ = std::fs::remove_dir_all(&dir);
}
