//! A data dir written by an earlier release opens with every topic, message, subscription
//! position and user intact.
//!
//! `fixtures/data-41d7ac7.tar.gz` is the data dir of the broker at 41d7ac7 (protocol version 1,
//! topic config without `default` storage), made with that build:
//!
//! ```text
//! FERRYMQ_ADMIN_PASSWORD=fixture-admin-password ferrymq serve --data-dir ./data
//! ferrymq topic create orders --partitions 2
//! seq 1 10 | ferrymq pub orders --quiet --key k          # 0-0 .. 0-9
//! ferrymq pub orders "with headers" --header a=1 --key z # 1-0
//! ferrymq sub orders --subscription billing --from earliest --count 4   # acks 0-0 .. 0-3
//! ferrymq topic create jobs --partitions 1 --retention-policy work-queue
//! ferrymq pub jobs "job 1"; ferrymq pub jobs "job 2"
//! ferrymq sub jobs --subscription workers --from earliest --count 1     # acks 0-0
//! FERRYMQ_NEW_PASSWORD=fixture-reader-password ferrymq user add reader
//! ```
//!
//! and a SIGTERM (with the CLI's `FERRYMQ_USER=admin`, `FERRYMQ_PASSWORD=...`).

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::{temp_dir, Served};
use ferrymq_client::{
    Client, ClientConfig, RetentionPolicy, StartPosition, Storage, SubscribeOptions,
};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/data-41d7ac7.tar.gz"
);

/// Receives until nothing more comes for a moment; returns (id, body) pairs, acked.
async fn drain(client: &Client, topic: &str, subscription: &str) -> Vec<(String, String)> {
    let mut sub = client
        .subscribe(
            SubscribeOptions::new(topic)
                .subscription(subscription)
                .start(StartPosition::Earliest),
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    // Every message there is arrives well within the first wait; the short ones after it only
    // confirm that nothing else does.
    let mut wait = Duration::from_secs(10);
    while let Ok(Some(delivery)) = tokio::time::timeout(wait, sub.next()).await {
        let delivery = delivery.unwrap();
        got.push((
            format!("{}-{}", delivery.partition, delivery.offset),
            String::from_utf8_lossy(&delivery.message.body).to_string(),
        ));
        sub.ack(&delivery).await.unwrap();
        wait = Duration::from_millis(500);
    }
    got
}

#[tokio::test]
async fn the_data_dir_of_41d7ac7_opens_with_everything_in_it() {
    let root = temp_dir("upgrade-41d7ac7");
    let status = Command::new("tar")
        .args(["xzf", FIXTURE, "-C"])
        .arg(&root)
        .status()
        .unwrap();
    assert!(status.success(), "tar xzf {FIXTURE}");
    let data = root.join("data");
    let mut served = Served::start_in(&data, &[], &[]);
    let tcp = served.tcp_addr();

    // The users: the admin logs in with its password, and the reader is still there.
    let client = Client::connect_with(
        ClientConfig::new(tcp.to_string()).credentials("admin", "fixture-admin-password"),
    )
    .await
    .expect("the admin of the old data dir logs in");
    let users: BTreeSet<String> = client
        .user_list()
        .await
        .unwrap()
        .into_iter()
        .map(|u| u.name)
        .collect();
    assert_eq!(users, BTreeSet::from(["admin".into(), "reader".into()]));
    let reader = Client::connect_with(
        ClientConfig::new(tcp.to_string()).credentials("reader", "fixture-reader-password"),
    )
    .await
    .expect("the reader logs in");
    reader.close().await.unwrap();

    // The topics, with their settings and what they hold.
    let orders = client.describe_topic("orders").await.unwrap();
    assert_eq!(orders.config.partitions, 2);
    assert_eq!(orders.config.storage, Storage::Disk);
    assert_eq!(orders.subscriptions, ["billing"]);
    let jobs = client.describe_topic("jobs").await.unwrap();
    assert_eq!(jobs.config.retention_policy, RetentionPolicy::WorkQueue);

    // Each subscription goes on from where it was: billing acked 0-0 .. 0-3, workers job 1.
    let billing = drain(&client, "orders", "billing").await;
    let ids: BTreeSet<&str> = billing.iter().map(|(id, _)| id.as_str()).collect();
    let want: BTreeSet<&str> = ["0-4", "0-5", "0-6", "0-7", "0-8", "0-9", "1-0"].into();
    assert_eq!(ids, want, "{billing:?}");
    assert!(billing.contains(&("1-0".into(), "with headers".into())));
    let workers = drain(&client, "jobs", "workers").await;
    assert_eq!(workers, [("0-1".to_string(), "job 2".to_string())]);

    // And the broker writes to it as to any: a new message comes after the old ones.
    let receipt = client
        .publish(
            "orders",
            ferrymq_client::Message::new("after the upgrade").with_key("k"),
        )
        .await
        .unwrap();
    assert_eq!(receipt.to_string(), "0-10");
    client.close().await.unwrap();
    served.signal("TERM");
    assert!(served.wait_exit().success());
    let _ = std::fs::remove_dir_all(&root);
}
