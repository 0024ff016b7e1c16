//! Thousands of disk topics on a low open-files limit: a real `ferrymq serve` started with
//! `RLIMIT_NOFILE` at 1024 (soft and hard, what a new user's shell often has) creates them,
//! stores a message in each, restarts, and serves every one, none reported damaged.
//!
//! The partition logs share one bounded set of open files sized from the limit, so the number of
//! topics is limited by the disk, not by descriptors.

mod common;

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{temp_dir, Served};
use ferrymq_client::{
    Client, FsyncPolicy, Message, StartPosition, Storage, SubscribeOptions, TopicConfig,
};

/// The limit a new user's shell commonly has (`ulimit -n`).
const OPEN_FILES: u64 = 1024;
/// Three files per partition: four times what the limit allows open at once (the broker before
/// the bound was sized from the limit failed after 336 topics). A restart syncs each partition's
/// active segment, about 10 ms each on a busy 2-core machine: more topics would make a slow test.
const TOPICS: usize = 1500;
/// Requests in flight at once: enough to keep both cores busy, few enough to leave the broker
/// descriptors for nothing but its logs.
const IN_FLIGHT: usize = 16;
/// Bounds each phase on this busy machine; a phase normally takes a few seconds.
const PHASE_LIMIT: Duration = Duration::from_secs(60);

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

/// Runs `each` for every topic index, `IN_FLIGHT` at a time, within `PHASE_LIMIT`.
async fn for_every_topic<F, Fut>(what: &str, client: &Client, each: F) -> Duration
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
            for i in (worker..TOPICS).step_by(IN_FLIGHT) {
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
    match tokio::time::timeout(PHASE_LIMIT, all).await {
        Ok(Ok(())) => started.elapsed(),
        Ok(Err(error)) => panic!("{what}: {error}"),
        Err(_) => panic!("{what}: not done within {PHASE_LIMIT:?}"),
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
        let created = for_every_topic("create", &client, |client, i| async move {
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
        let published = for_every_topic("publish", &client, |client, i| async move {
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
    served.signal("TERM");
    assert!(served.wait_exit().success(), "{}", served.seen.join("\n"));

    let restarted_at = Instant::now();
    let mut served = Served::start_with(&args, &[], limited);
    let addr = served.tcp_addr_within(PHASE_LIMIT).to_string();
    let restarted = restarted_at.elapsed();
    let read = runtime().block_on(async {
        let client = Client::connect(addr.as_str()).await.unwrap();
        let read = for_every_topic("read back", &client, |client, i| async move {
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
    assert!(served.wait_exit().success(), "{}", served.seen.join("\n"));
    let damaged: Vec<&String> = served
        .seen
        .iter()
        .filter(|line| line.contains("damaged") || line.contains("open files"))
        .filter(|line| !line.contains("open-files limit"))
        .collect();
    assert!(damaged.is_empty(), "after the restart: {damaged:#?}");
    eprintln!(
        "{TOPICS} disk topics under {OPEN_FILES} open files: created in {created:?}, published in \
         {published:?}, serving again {restarted:?} after the restart began, read back in {read:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
