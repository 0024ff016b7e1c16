//! The Rust bus against a real broker: a drain finishes the handlers in flight and gives back
//! the prefetched messages without an attempt counted; a receiver keeps receiving across a
//! broker restart (kill -9, then start again on the same data dir and port); a failing handler
//! is retried with backoff and dead-lettered with its error; an ordered receiver keeps each
//! key's order across retries while handlers run concurrently; a drain gives up a handler past
//! its timeout; the bus works with `publish` to send and `consume` to receive.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{temp_dir, Served};
use ferrymq_client::bus::{
    BusMessage, Context, FieldType, Handler, HandlerError, Receiver, ReceiverOptions, RetryPolicy,
    RunSummary, Sender, Settings,
};
use ferrymq_client::{Client, StartPosition, SubscribeOptions};
use serde::{Deserialize, Serialize};

/// How long any one state a test waits for may take on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    id: i64,
    customer: String,
}

impl BusMessage for Job {
    const TYPE_NAME: &'static str = "Job";
    const FIELDS: &'static [(&'static str, FieldType)] =
        &[("id", FieldType::Int), ("customer", FieldType::String)];
    const KEY: &'static str = "customer";
}

/// Records what it handled; fails a message while `fail_until` says so; takes `work` each.
struct Recorder {
    /// Handlers that began, finished or not.
    started: AtomicUsize,
    seen: Mutex<Vec<(i64, Context)>>,
    work: Duration,
    /// Attempts a message fails before it succeeds (0: never fails; u16::MAX: always).
    failures: u16,
    retry: Option<RetryPolicy>,
}

impl Recorder {
    fn new(work: Duration) -> Arc<Recorder> {
        Arc::new(Recorder {
            started: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
            work,
            failures: 0,
            retry: None,
        })
    }

    fn seen(&self) -> Vec<(i64, Context)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Handler<Job> for Recorder {
    async fn handle(&self, job: &Job, context: &Context) -> Result<(), String> {
        self.started.fetch_add(1, Ordering::SeqCst);
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        self.seen.lock().unwrap().push((job.id, context.clone()));
        if context.attempt <= self.failures {
            return Err(format!("ValueError: bad total for job {}", job.id));
        }
        Ok(())
    }

    fn retry(&self) -> Option<RetryPolicy> {
        self.retry
    }
}

fn settings(addr: &str, identity: &str) -> Settings {
    Settings {
        addr: addr.to_string(),
        identity: identity.to_string(),
        shard_count: 2,
        ..Settings::default()
    }
}

async fn send_jobs(client: &Client, settings: &Settings, ids: std::ops::Range<i64>, keys: i64) {
    let sender = Sender::new(client.clone(), settings.clone());
    for id in ids {
        let job = Job {
            id,
            customer: format!("c{}", id % keys),
        };
        sender.send(&job).await.expect("sends");
    }
}

/// Runs `receiver` in a task; returns its join handle and drain handle.
fn spawn_run(
    mut receiver: Receiver<Job, Recorder>,
) -> (
    tokio::task::JoinHandle<RunSummary>,
    ferrymq_client::bus::DrainHandle,
) {
    let drain = receiver.drain_handle();
    let run = tokio::spawn(async move { receiver.run(|_| {}).await.expect("runs") });
    (run, drain)
}

/// Waits (bounded) until `handler` has seen `count` messages.
async fn wait_seen(handler: &Recorder, count: usize) {
    let deadline = Instant::now() + DEADLINE;
    while handler.seen.lock().unwrap().len() < count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} handled in time",
            handler.seen.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How many different messages `handler` has seen.
fn distinct(handler: &Recorder) -> usize {
    let seen = handler.seen.lock().unwrap();
    seen.iter()
        .map(|(id, _)| *id)
        .collect::<HashSet<i64>>()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_finishes_handlers_in_flight_and_releases_unstarted_messages() {
    let dir = temp_dir("bus-drain");
    let mut served = Served::start_in(&dir, &[], &[]);
    let addr = served.tcp_addr().to_string();
    let client = Client::connect(addr.clone()).await.unwrap();
    let settings = settings(&addr, "drainer");
    let total = 300;
    send_jobs(&client, &settings, 0..total, 7).await;

    let options = ReceiverOptions {
        concurrency: 4,
        ..ReceiverOptions::default()
    };
    let first = Recorder::new(Duration::from_millis(2));
    let receiver = Receiver::subscribe(&client, settings.clone(), first.clone(), options.clone())
        .await
        .unwrap();
    let (run, drain) = spawn_run(receiver);
    wait_seen(&first, 40).await;
    drain.drain();
    let summary = tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
    assert!(summary.released > 0, "{summary:?}");
    assert_eq!(summary.abandoned, 0, "{summary:?}");
    assert_eq!(summary.handled as usize, first.seen().len(), "{summary:?}");

    // A second worker takes the rest: nothing twice, and no message spent an attempt.
    let second = Recorder::new(Duration::ZERO);
    let receiver = Receiver::subscribe(&client, settings, second.clone(), options)
        .await
        .unwrap();
    let (run, drain) = spawn_run(receiver);
    wait_seen(&second, total as usize - first.seen().len()).await;
    drain.drain();
    tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
    let all: Vec<(i64, Context)> = first.seen().into_iter().chain(second.seen()).collect();
    let ids: HashSet<i64> = all.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        all.len(),
        total as usize,
        "duplicates: handled {}",
        all.len()
    );
    assert_eq!(ids.len(), total as usize);
    let counted: Vec<_> = all.iter().filter(|(_, c)| c.attempt != 1).collect();
    assert!(counted.is_empty(), "attempts spent: {counted:?}");
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_keeps_receiving_across_a_broker_restart() {
    let dir = temp_dir("bus-restart");
    let mut served = Served::start_in(&dir, &[], &[]);
    let addr = served.tcp_addr().to_string();
    let client = Client::connect(addr.clone()).await.unwrap();
    let settings = settings(&addr, "survivor");
    let handler = Recorder::new(Duration::ZERO);
    let receiver = Receiver::subscribe(
        &client,
        settings.clone(),
        handler.clone(),
        ReceiverOptions::default(),
    )
    .await
    .unwrap();
    let (run, drain) = spawn_run(receiver);
    send_jobs(&client, &settings, 0..10, 3).await;
    wait_seen(&handler, 10).await;

    served.child.kill().unwrap();
    served.wait_exit();
    let dir_arg = dir.to_str().unwrap();
    let mut served = Served::start(&["--tcp-addr", &addr, "--data-dir", dir_arg], &[]);
    assert_eq!(served.tcp_addr().to_string(), addr);
    let client = Client::connect(addr.clone()).await.unwrap();
    send_jobs(&client, &settings, 10..20, 3).await;
    // At least once: a message whose ack the kill cut off comes again, so count distinct ids.
    let deadline = Instant::now() + DEADLINE;
    while distinct(&handler) < 20 {
        assert!(Instant::now() < deadline, "{} of 20", distinct(&handler));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drain.drain();
    let summary = tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
    assert!(summary.reconnects >= 1, "{summary:?}");
    let ids: HashSet<i64> = handler.seen().iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, (0..20).collect::<HashSet<i64>>());
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_handler_is_retried_with_backoff_and_dead_lettered_with_its_error() {
    let dir = temp_dir("bus-retry");
    let mut served = Served::start_in(&dir, &[], &[]);
    let addr = served.tcp_addr().to_string();
    let client = Client::connect(addr.clone()).await.unwrap();
    let settings = settings(&addr, "retrier");
    let handler = Arc::new(Recorder {
        started: AtomicUsize::new(0),
        seen: Mutex::new(Vec::new()),
        work: Duration::ZERO,
        failures: u16::MAX,
        retry: Some(RetryPolicy {
            max_attempts: Some(3),
            initial_delay_ms: 100,
            multiplier: 2.0,
            max_delay_ms: 1000,
            jitter: 0.0,
        }),
    });
    let errors: Arc<Mutex<Vec<HandlerError>>> = Arc::default();
    let reported = errors.clone();
    let receiver = Receiver::subscribe(
        &client,
        settings.clone(),
        handler.clone(),
        ReceiverOptions::default(),
    )
    .await
    .unwrap()
    .on_error(move |e| reported.lock().unwrap().push(e.clone()));
    let (run, drain) = spawn_run(receiver);
    let started = Instant::now();
    send_jobs(&client, &settings, 0..1, 1).await;
    wait_seen(&handler, 3).await;
    // Two delays, 100 then 200 ms, before the third attempt.
    assert!(started.elapsed() >= Duration::from_millis(300));
    let attempts: Vec<u16> = handler.seen().iter().map(|(_, c)| c.attempt).collect();
    assert_eq!(attempts, [1, 2, 3]);

    let dead = SubscribeOptions::new("Job.dlq")
        .subscription("inspect")
        .start(StartPosition::Earliest);
    let mut dead = client.subscribe(dead).await.unwrap();
    let letter = tokio::time::timeout(DEADLINE, dead.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let header = |name: &str| {
        letter
            .message
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let reason = header("x-ferrymq-dead-reason").unwrap();
    assert_eq!(reason, "ValueError: bad total for job 0");
    assert_eq!(header("x-ferrymq-dead-attempts").as_deref(), Some("3"));
    drain.drain();
    let summary = tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
    assert_eq!(summary.failed, 3, "{summary:?}");
    // on_error saw each failure once, with its attempt, delay and whether it was the last.
    let errors = errors.lock().unwrap().clone();
    let seen: Vec<(u16, u32, bool)> = errors
        .iter()
        .map(|e| (e.attempt, e.delay_ms, e.dead_lettered))
        .collect();
    assert_eq!(seen, [(1, 100, false), (2, 200, false), (3, 0, true)]);
    assert!(errors
        .iter()
        .all(|e| e.reason == "ValueError: bad total for job 0" && e.type_name == "Job"));
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_receiver_keeps_each_keys_order_across_retries() {
    let dir = temp_dir("bus-ordered");
    let mut served = Served::start_in(&dir, &[], &[]);
    let addr = served.tcp_addr().to_string();
    let client = Client::connect(addr.clone()).await.unwrap();
    let settings = settings(&addr, "orderly");
    let handler = Arc::new(Recorder {
        started: AtomicUsize::new(0),
        seen: Mutex::new(Vec::new()),
        work: Duration::from_millis(1),
        failures: 1,
        retry: Some(RetryPolicy {
            initial_delay_ms: 10,
            ..RetryPolicy::attempts(5)
        }),
    });
    let keys = 4;
    let total = 40;
    send_jobs(&client, &settings, 0..total, keys).await;
    let options = ReceiverOptions {
        concurrency: 4,
        ordered: true,
        ..ReceiverOptions::default()
    };
    let receiver = Receiver::subscribe(&client, settings, handler.clone(), options)
        .await
        .unwrap();
    let (run, drain) = spawn_run(receiver);
    // Every message fails once, then succeeds.
    wait_seen(&handler, 2 * total as usize).await;
    drain.drain();
    tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
    let mut per_key: HashMap<i64, Vec<(i64, u16)>> = HashMap::new();
    for (id, context) in handler.seen() {
        per_key
            .entry(id % keys)
            .or_default()
            .push((id, context.attempt));
    }
    for (key, order) in per_key {
        let expected: Vec<(i64, u16)> = (0..total)
            .filter(|id| id % keys == key)
            .flat_map(|id| [(id, 1), (id, 2)])
            .collect();
        assert_eq!(order, expected, "key c{key}");
    }
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Over the binary protocol: the broker gives a message up on the nack that spends its last
/// attempt and keeps that nack's reason in the dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_keeps_the_last_nack_reason_in_the_dead_letter() {
    let dir = temp_dir("bus-nack-reason");
    let mut served = Served::start_in(&dir, &[], &[]);
    let addr = served.tcp_addr().to_string();
    let client = Client::connect(addr).await.unwrap();
    let options = SubscribeOptions::new("payments")
        .subscription("workers")
        .start(StartPosition::Earliest)
        .max_attempts(3);
    let mut subscription = client.subscribe(options).await.unwrap();
    client
        .publish("payments", ferrymq_client::Message::new("p1"))
        .await
        .unwrap();
    for attempt in 1..=3u16 {
        let delivery = tokio::time::timeout(DEADLINE, subscription.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(delivery.attempt, attempt);
        let range = ferrymq_client::OffsetRange::single(delivery.partition, delivery.offset);
        subscription
            .nack_with_reason(&[range], Duration::ZERO, "ValueError: bad total")
            .await
            .unwrap();
    }
    let dead = SubscribeOptions::new("payments.dlq")
        .subscription("inspect")
        .start(StartPosition::Earliest);
    let mut dead = client.subscribe(dead).await.unwrap();
    let letter = tokio::time::timeout(DEADLINE, dead.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let reason = letter
        .message
        .headers
        .iter()
        .find(|(name, _)| name == "x-ferrymq-dead-reason")
        .map(|(_, value)| value.as_str());
    assert_eq!(
        reason,
        Some("max_attempts (3) reached: ValueError: bad total")
    );
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Least privilege: with the topic made by an administrator, a sender needs only `publish` on
/// it and a receiver only `consume`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bus_works_with_publish_to_send_and_consume_to_receive() {
    use ferrymq_broker::auth::{ACTION_CONSUME, ACTION_PUBLISH};
    use ferrymq_client::{ClientConfig, Storage, TopicConfig};

    const ADMIN_PASSWORD: &str = "admin-Secret-7431";
    let dir = temp_dir("bus-least-privilege");
    let mut served = Served::start_in(&dir, &[], &[("FERRYMQ_ADMIN_PASSWORD", ADMIN_PASSWORD)]);
    let addr = served.tcp_addr().to_string();
    let login = |user: &str, password: &str| {
        Client::connect_with(ClientConfig::new(addr.clone()).credentials(user, password))
    };
    let admin = login("admin", ADMIN_PASSWORD).await.unwrap();
    let config = TopicConfig {
        partitions: 2,
        storage: Storage::Disk,
        ..TopicConfig::default()
    };
    admin.create_topic("Job", config, false).await.unwrap();
    for (user, action) in [("checkout", ACTION_PUBLISH), ("billing", ACTION_CONSUME)] {
        admin
            .user_add(user, &format!("{user}-Secret-2207"), 0)
            .await
            .unwrap();
        admin.grant(user, "Job", action, 0).await.unwrap();
    }

    let sending = login("checkout", "checkout-Secret-2207").await.unwrap();
    let sender = Sender::new(sending, settings(&addr, "checkout")).create_topics(false);
    for id in 0..5 {
        let job = Job {
            id,
            customer: format!("c{id}"),
        };
        sender.send(&job).await.expect("publish is enough to send");
    }
    let receiving = login("billing", "billing-Secret-2207").await.unwrap();
    let handler = Recorder::new(Duration::ZERO);
    let options = ReceiverOptions {
        create_topics: false,
        ..ReceiverOptions::default()
    };
    let receiver = Receiver::subscribe(
        &receiving,
        settings(&addr, "billing"),
        handler.clone(),
        options,
    )
    .await
    .expect("consume is enough to receive");
    let (run, drain) = spawn_run(receiver);
    wait_seen(&handler, 5).await;
    drain.drain();
    tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A handler still running at the drain timeout is given up: the run returns, and its message
/// comes again, counted as an attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_gives_up_a_handler_past_its_timeout() {
    let dir = temp_dir("bus-drain-timeout");
    let mut served = Served::start_in(&dir, &[], &[]);
    let addr = served.tcp_addr().to_string();
    let client = Client::connect(addr.clone()).await.unwrap();
    let settings = settings(&addr, "stuck");
    send_jobs(&client, &settings, 0..1, 1).await;
    let options = ReceiverOptions {
        drain_timeout: Duration::from_millis(200),
        ..ReceiverOptions::default()
    };
    // Longer than any test: it only ends by the drain.
    let stuck = Recorder::new(Duration::from_secs(3600));
    let mut receiver =
        Receiver::subscribe(&client, settings.clone(), stuck.clone(), options.clone())
            .await
            .unwrap();
    let drain = receiver.drain_handle();
    let run = tokio::spawn(async move { receiver.run(|_| {}).await.expect("runs") });
    let deadline = Instant::now() + DEADLINE;
    while stuck.started.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the handler never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drain.drain();
    let summary = tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
    assert_eq!(summary.abandoned, 1, "{summary:?}");

    let next = Recorder::new(Duration::ZERO);
    let receiver = Receiver::subscribe(&client, settings, next.clone(), options)
        .await
        .unwrap();
    let (run, drain) = spawn_run(receiver);
    wait_seen(&next, 1).await;
    assert_eq!(next.seen()[0].1.attempt, 2);
    drain.drain();
    tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}
