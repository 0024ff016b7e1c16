//! A topic's retention policy against a real `ferrymq serve`: a stream keeps what every
//! subscription acked for a subscription created later from `earliest`; a work queue deletes it;
//! each topic keeps its policy across a restart, and disk topics are streams by default.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{http, temp_dir, Served};
use ferrymq_client::{
    Client, ClientConfig, Message, RetentionPolicy, StartPosition, Storage, SubscribeOptions,
    TopicConfig,
};

const MESSAGES: usize = 200;

fn start(dir: &Path) -> (Served, SocketAddr, SocketAddr) {
    // Small segments, so that retention (whole closed segments) has something to delete.
    let mut served = Served::start(
        &[
            "--tcp-addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
            "--segment-bytes",
            "4096",
        ],
        &[],
    );
    let tcp = served.tcp_addr();
    let http = served.http_addr();
    (served, tcp, http)
}

async fn connect(tcp: SocketAddr) -> Client {
    Client::connect_with(ClientConfig::new(tcp.to_string()))
        .await
        .unwrap()
}

/// Publishes `MESSAGES` messages and has an auto-ack subscription read them all.
async fn publish_and_consume(client: &Client, topic: &str) {
    for i in 0..MESSAGES {
        client
            .publish(
                topic,
                Message::new(format!("message {i} {}", "x".repeat(64))),
            )
            .await
            .unwrap();
    }
    let mut reader = client
        .subscribe(
            SubscribeOptions::new(topic)
                .subscription("reader")
                .start(StartPosition::Earliest)
                .auto_ack(true),
        )
        .await
        .unwrap();
    for _ in 0..MESSAGES {
        let delivery = tokio::time::timeout(Duration::from_secs(10), reader.next())
            .await
            .expect("a delivery within 10 s")
            .unwrap()
            .unwrap();
        drop(delivery);
    }
}

/// How many messages a new subscription from `earliest` receives (bounded by time).
async fn replayed(client: &Client, topic: &str, name: &str) -> usize {
    let mut late = client
        .subscribe(
            SubscribeOptions::new(topic)
                .subscription(name)
                .start(StartPosition::Earliest)
                .auto_ack(true),
        )
        .await
        .unwrap();
    let mut count = 0;
    while let Ok(Some(delivery)) =
        tokio::time::timeout(Duration::from_millis(1500), late.next()).await
    {
        delivery.unwrap();
        count += 1;
    }
    count
}

fn described(http_addr: SocketAddr, topic: &str) -> serde_json::Value {
    let (status, body) = http(http_addr, "GET", &format!("/topics/{topic}"), &[], b"");
    assert_eq!(status, 200);
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_keeps_acked_messages_and_a_work_queue_deletes_them_across_a_restart() {
    let dir = temp_dir("retention-policy");
    let (mut served, tcp, http_addr) = start(&dir);
    let client = connect(tcp).await;
    // The default for a disk topic: a stream.
    let disk = TopicConfig {
        storage: Storage::Disk,
        ..TopicConfig::default()
    };
    client
        .create_topic("events", disk.clone(), false)
        .await
        .unwrap();
    client
        .create_topic(
            "jobs",
            TopicConfig {
                retention_policy: RetentionPolicy::WorkQueue,
                ..disk
            },
            false,
        )
        .await
        .unwrap();
    assert_eq!(
        client
            .describe_topic("events")
            .await
            .unwrap()
            .config
            .retention_policy,
        RetentionPolicy::Stream
    );
    assert_eq!(
        described(http_addr, "jobs")["retention_policy"],
        "work_queue"
    );

    publish_and_consume(&client, "events").await;
    publish_and_consume(&client, "jobs").await;

    // Retention runs every second: the work queue's acked segments go.
    let deadline = Instant::now() + Duration::from_secs(15);
    while client.describe_topic("jobs").await.unwrap().messages as usize >= MESSAGES {
        assert!(
            Instant::now() < deadline,
            "acked segments of the work queue were not deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The stream keeps them, past a few retention rounds, for a subscription added later.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        client.describe_topic("events").await.unwrap().messages as usize,
        MESSAGES
    );
    assert_eq!(replayed(&client, "events", "late").await, MESSAGES);
    assert!(replayed(&client, "jobs", "late").await < MESSAGES);
    drop(client);

    served.signal("TERM");
    assert!(served.wait_exit().success());
    drop(served);
    let (_served, tcp, http_addr) = start(&dir);
    let client = connect(tcp).await;
    assert_eq!(described(http_addr, "events")["retention_policy"], "stream");
    assert_eq!(
        described(http_addr, "jobs")["retention_policy"],
        "work_queue"
    );
    assert_eq!(replayed(&client, "events", "after-restart").await, MESSAGES);
    assert!(replayed(&client, "jobs", "after-restart").await < MESSAGES);

    // Bad values are refused, naming the field.
    let (status, body) = http(
        http_addr,
        "POST",
        "/topics",
        &[("Content-Type", "application/json")],
        br#"{"name": "bad", "retention_policy": "forever"}"#,
    );
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("retention_policy"), "{body}");
    let _ = std::fs::remove_dir_all(dir);
}
