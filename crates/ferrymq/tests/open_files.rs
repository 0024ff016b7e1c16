//! Thousands of disk topics on a low open-files limit: a real `ferrymq serve` started with
//! `RLIMIT_NOFILE` at 1024 (soft and hard, what a new user's shell often has) creates them,
//! stores a message in each, restarts, and serves every one, none reported damaged.
//!
//! The partition logs share one bounded set of open files sized from the limit, so the number of
//! topics is limited by the disk, not by descriptors. Also here: a soft limit below the hard one
//! is raised at start, and a broker whose descriptors connections took refuses publishes with an
//! error naming the limit, then recovers by itself when they are freed.

mod common;

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{temp_dir, Served};
use ferrymq_client::{
    Client, ErrorCode, FsyncPolicy, Message, StartPosition, Storage, SubscribeOptions, TopicConfig,
};

/// The limit a new user's shell commonly has (`ulimit -n`).
const OPEN_FILES: u64 = 1024;
/// Three files per partition: four times what the limit allows open at once (the broker before
/// the bound was sized from the limit failed after 336 topics). A restart and a shutdown sync
/// each partition, about 10 ms each on a busy 2-core machine: more topics would make a slow test.
/// `FERRYMQ_OPEN_FILES_TOPICS` asks for another number (a measurement of 10 000, say).
const TOPICS_DEFAULT: usize = 1500;
/// Requests in flight at once: enough to keep both cores busy, few enough to leave the broker
/// descriptors for nothing but its logs.
const IN_FLIGHT: usize = 16;
/// Bounds each phase of `TOPICS_DEFAULT` topics on a busy machine (a restart takes about 20 s,
/// the other phases less); more topics have proportionally more time.
const PHASE_LIMIT: Duration = Duration::from_secs(60);

fn topic_count() -> usize {
    std::env::var("FERRYMQ_OPEN_FILES_TOPICS")
        .ok()
        .map(|count| {
            count
                .parse()
                .expect("FERRYMQ_OPEN_FILES_TOPICS is a number of topics")
        })
        .unwrap_or(TOPICS_DEFAULT)
}

fn phase_limit(topics: usize) -> Duration {
    PHASE_LIMIT * topics.div_ceil(TOPICS_DEFAULT).max(1) as u32
}

/// Sets `RLIMIT_NOFILE` in the child before it runs the broker.
fn limit_open_files(command: &mut Command, soft: u64, hard: u64) {
    // SAFETY: setrlimit is async-signal-safe, and the closure touches nothing else.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: soft as libc::rlim_t,
                rlim_max: hard as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn topic_name(i: usize) -> String {
    format!("many-{i:05}")
}

fn body(i: usize) -> String {
    format!("message for topic {i}")
}

/// Runs `each` for every topic index, `IN_FLIGHT` at a time, within the phase limit.
async fn for_every_topic<F, Fut>(what: &str, topics: usize, client: &Client, each: F) -> Duration
where
    F: Fn(Client, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let started = Instant::now();
    let each = Arc::new(each);
    let mut workers = Vec::new();
    for worker in 0..IN_FLIGHT {
        let client = client.clone();
        let each = Arc::clone(&each);
        workers.push(tokio::spawn(async move {
            for i in (worker..topics).step_by(IN_FLIGHT) {
                each(client.clone(), i).await?;
            }
            Ok::<(), String>(())
        }));
    }
    let all = async {
        for worker in workers {
            worker.await.expect("worker task")?;
        }
        Ok::<(), String>(())
    };
    let limit = phase_limit(topics);
    match tokio::time::timeout(limit, all).await {
        Ok(Ok(())) => started.elapsed(),
        Ok(Err(error)) => panic!("{what}: {error}"),
        Err(_) => panic!("{what}: not done within {limit:?}"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn thousands_of_disk_topics_are_created_restarted_and_served_under_1024_open_files() {
    let topics = topic_count();
    let limit = phase_limit(topics);
    let dir = temp_dir("open-files");
    let data = dir.join("data");
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--tcp-addr",
        "127.0.0.1:0",
    ];
    let limited = |command: &mut Command| limit_open_files(command, OPEN_FILES, OPEN_FILES);

    let mut served = Served::start_with(&args, &[], limited);
    let addr = served.tcp_addr().to_string();
    let (created, published) = runtime().block_on(async {
        let client = Client::connect(addr.as_str()).await.unwrap();
        let created = for_every_topic("create", topics, &client, |client, i| async move {
            let config = TopicConfig {
                storage: Storage::Disk,
                fsync: FsyncPolicy::Always,
                ..TopicConfig::default()
            };
            client
                .create_topic(&topic_name(i), config, false)
                .await
                .map_err(|e| format!("creating {} failed: {e}", topic_name(i)))
        })
        .await;
        let published = for_every_topic("publish", topics, &client, |client, i| async move {
            client
                .publish(&topic_name(i), Message::new(body(i)))
                .await
                .map(|_| ())
                .map_err(|e| format!("publishing to {} failed: {e}", topic_name(i)))
        })
        .await;
        client.close().await.unwrap();
        (created, published)
    });
    let stopping_at = Instant::now();
    served.signal("TERM");
    let status = served.wait_exit_within(limit);
    assert!(status.success(), "{}", served.seen.join("\n"));
    let stopped = stopping_at.elapsed();

    let restarted_at = Instant::now();
    let mut served = Served::start_with(&args, &[], limited);
    let addr = served.tcp_addr_within(limit).to_string();
    let restarted = restarted_at.elapsed();
    let read = runtime().block_on(async {
        let client = Client::connect(addr.as_str()).await.unwrap();
        let read = for_every_topic("read back", topics, &client, |client, i| async move {
            let topic = topic_name(i);
            let mut subscription = client
                .subscribe(SubscribeOptions::new(&topic).start(StartPosition::Earliest))
                .await
                .map_err(|e| format!("subscribing to {topic} failed: {e}"))?;
            let delivery = tokio::time::timeout(Duration::from_secs(10), subscription.next())
                .await
                .map_err(|_| format!("{topic} delivered nothing"))?
                .ok_or_else(|| format!("{topic}: the subscription ended"))?
                .map_err(|e| format!("{topic}: {e}"))?;
            if delivery.message.body != body(i).as_bytes() {
                return Err(format!(
                    "{topic} delivered {:?}",
                    String::from_utf8_lossy(&delivery.message.body)
                ));
            }
            subscription
                .ack(&delivery)
                .await
                .map_err(|e| format!("{topic}: ack failed: {e}"))
        })
        .await;
        // A publish after the restart reaches the files that were closed to make room.
        let id = client
            .publish(&topic_name(0), Message::new("after the restart"))
            .await;
        assert!(id.is_ok(), "publish after the restart: {id:?}");
        client.close().await.unwrap();
        read
    });
    served.signal("TERM");
    let status = served.wait_exit_within(limit);
    assert!(status.success(), "{}", served.seen.join("\n"));
    let damaged: Vec<&String> = served
        .seen
        .iter()
        .filter(|line| line.contains("damaged") || line.contains("open files"))
        .filter(|line| !line.contains("open-files limit"))
        .collect();
    assert!(damaged.is_empty(), "after the restart: {damaged:#?}");
    eprintln!(
        "{topics} disk topics under {OPEN_FILES} open files: created in {created:?}, published in \
         {published:?}, stopped in {stopped:?}, serving again {restarted:?} after the restart \
         began, read back in {read:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Descriptors the broker may hold in the test below: its partition logs keep half, and the
/// idle connections the test opens take the rest.
const SCARCE_OPEN_FILES: u64 = 128;
/// More topics than the logs' share of the limit can keep open (a publish under fsync=always
/// writes one file, the segment), so that publishing to them in turn has to open files.
const SCARCE_TOPICS: usize = 100;
/// Idle connections opened to use up the broker's descriptors: more than its limit, so that the
/// ones waiting in the listener's backlog take each descriptor the broker frees.
const HOG_CONNECTIONS: usize = 300;

/// Connections that take every descriptor the broker has: an open that finds none free closes
/// the logs' cached handles and uses what that freed; when nothing is left, the publish is
/// refused with an error that names the limit (never "damaged"), and the partition takes
/// publishes again by itself once descriptors free up.
#[test]
fn a_publish_out_of_descriptors_names_the_limit_and_the_broker_recovers() {
    let dir = temp_dir("open-files-scarce");
    let data = dir.join("data");
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--tcp-addr",
        "127.0.0.1:0",
    ];
    let mut served = Served::start_with(&args, &[], |command| {
        limit_open_files(command, SCARCE_OPEN_FILES, SCARCE_OPEN_FILES)
    });
    let tcp = served.tcp_addr();
    let addr = tcp.to_string();
    // The client answers the broker's heartbeats while the test waits outside the runtime.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async {
        let client = Client::connect(addr.as_str()).await.unwrap();
        for i in 0..SCARCE_TOPICS {
            let config = TopicConfig {
                storage: Storage::Disk,
                ..TopicConfig::default()
            };
            client
                .create_topic(&topic_name(i), config, false)
                .await
                .unwrap();
        }
        client
    });

    let hogs: Vec<std::net::TcpStream> = (0..HOG_CONNECTIONS)
        .filter_map(|_| std::net::TcpStream::connect_timeout(&tcp, Duration::from_secs(2)).ok())
        .collect();
    served.wait_for("accept failed");
    let refused: Vec<usize> = rt.block_on(async {
        let mut refused = Vec::new();
        for i in 0..SCARCE_TOPICS {
            if let Err(error) = client.publish(&topic_name(i), Message::new(body(i))).await {
                let message = error.to_string();
                assert!(
                    error.code() == Some(ErrorCode::StorageUnavailable)
                        && message.contains(&format!("open-files limit is {SCARCE_OPEN_FILES}"))
                        && message.contains("ulimit -n"),
                    "{}: a refusal names the limit and how to raise it: {message}",
                    topic_name(i)
                );
                refused.push(i);
            }
            // Lets the accept loop, which backs off 50 ms after a failure, take what was freed.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        refused
    });
    let log = served.collect().join("\n");
    assert!(
        !refused.is_empty(),
        "no publish met the exhausted limit:\n{log}"
    );
    assert!(!log.contains("damaged"), "{log}");

    // Descriptors free up: the refused partitions reopen by themselves and take publishes again.
    drop(hogs);
    rt.block_on(async {
        let deadline = Instant::now() + PHASE_LIMIT;
        for &i in &refused {
            loop {
                match client.publish(&topic_name(i), Message::new(body(i))).await {
                    Ok(_) => break,
                    Err(error) => assert!(
                        Instant::now() < deadline,
                        "{} did not recover once descriptors were free: {error}",
                        topic_name(i)
                    ),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        for i in 0..SCARCE_TOPICS {
            let mut subscription = client
                .subscribe(SubscribeOptions::new(topic_name(i)).start(StartPosition::Earliest))
                .await
                .unwrap();
            let delivery = tokio::time::timeout(Duration::from_secs(10), subscription.next())
                .await
                .expect("a delivery in time")
                .expect("an open subscription")
                .unwrap();
            assert_eq!(
                delivery.message.body,
                body(i).as_bytes(),
                "{}",
                topic_name(i)
            );
        }
        client.close().await.unwrap();
    });
    served.signal("TERM");
    let status = served.wait_exit();
    let log = served.collect().join("\n");
    assert!(status.success(), "{log}");
    assert!(!log.contains("damaged"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A soft limit below the hard one is raised at start, and the logs' share follows the raise.
#[test]
fn the_soft_open_files_limit_is_raised_to_the_hard_limit_at_start() {
    let dir = temp_dir("open-files-raise");
    let data = dir.join("data");
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--tcp-addr",
        "127.0.0.1:0",
    ];
    let mut served = Served::start_with(&args, &[], |command| {
        limit_open_files(command, 256, OPEN_FILES)
    });
    let line = served.wait_for("raised the open-files limit");
    assert!(
        line.contains(&format!("open_files={OPEN_FILES}"))
            && line.contains("raised_from=256")
            && line.contains(&format!("log_files_max={}", OPEN_FILES / 2)),
        "{line}"
    );
    served.tcp_addr();
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", served.child.id())).unwrap();
    let open_files = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("a 'Max open files' line");
    assert_eq!(
        open_files.split_whitespace().nth(3),
        Some(OPEN_FILES.to_string().as_str()),
        "{open_files}"
    );
    served.signal("TERM");
    assert!(served.wait_exit().success());
    let _ = std::fs::remove_dir_all(&dir);
}
