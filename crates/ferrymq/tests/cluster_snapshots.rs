//! Raft log compaction on three real nodes: each group snapshots every few entries and drops its
//! log below, message bodies staying in the partition's own log only. A node killed while the
//! others compact comes back and is sent a snapshot with the records it lacks; every node then
//! restarts from its snapshot with the same messages and the same acknowledged cursor.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{partition_logs, Cluster};
use ferrymq_client::protocol::OffsetRange;
use ferrymq_client::Subscription;

const TOPIC: &str = "ledger";

/// This node's group of `topic` in its `GET /node`, if it runs one.
fn group_of(cluster: &Cluster, index: usize) -> Option<serde_json::Value> {
    let http = cluster.nodes[index].http?;
    let (status, body) = common::http(http, "GET", "/node", &[], b"");
    if status != 200 {
        return None;
    }
    let node: serde_json::Value = serde_json::from_slice(&body).ok()?;
    node["cluster"]["groups"]
        .as_array()?
        .iter()
        .find(|g| g["topic"] == TOPIC)
        .cloned()
}

/// Waits (bounded) until `check` holds for the group of node `index`.
fn wait_group(
    cluster: &mut Cluster,
    index: usize,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let group = group_of(cluster, index);
        if let Some(g) = group.as_ref().filter(|g| check(g)) {
            return g.clone();
        }
        if Instant::now() > deadline {
            let id = cluster.nodes[index].id;
            panic!(
                "node {id}: {what}; its group: {group:?}\n{}",
                cluster.warnings()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The next `count` bodies `subscription` is given, each acked with confirmation.
async fn take_acked(subscription: &mut Subscription, count: usize) -> Vec<String> {
    let mut bodies = Vec::new();
    while bodies.len() < count {
        let next = tokio::time::timeout(Duration::from_secs(10), subscription.next()).await;
        let Ok(Some(Ok(delivery))) = next else {
            panic!(
                "delivery {} of {count} did not come: {next:?}",
                bodies.len()
            );
        };
        subscription
            .ack_confirmed(&[OffsetRange::single(delivery.partition, delivery.offset)])
            .await
            .unwrap();
        bodies.push(String::from_utf8(delivery.message.body.to_vec()).unwrap());
    }
    bodies
}

fn assert_identical_logs(cluster: &mut Cluster, expected: usize) {
    let logs = partition_logs(&cluster.nodes, TOPIC, 1);
    let want: Vec<String> = (0..expected).map(|i| format!("m{i}")).collect();
    for (node, log) in cluster.nodes.iter().zip(&logs) {
        assert_eq!(log[0], want, "node {}'s log of {TOPIC}/0", node.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_left_behind_is_sent_a_snapshot_and_every_node_restarts_from_its_own() {
    let mut cluster = Cluster::plan("cluster-snapshots", 3);
    let peers = cluster.direct_peers();
    for node in &mut cluster.nodes {
        node.peers = peers.clone();
        node.extra = vec!["--snapshot-entries".into(), "16".into()];
    }
    cluster.boot_all();
    let addrs = cluster.addrs();
    common::cluster::create_topic(&addrs, TOPIC, 1).await;

    common::cluster::publish_numbered(&addrs, TOPIC, 0, 40).await;
    let (client, mut sub) = common::cluster::attach(&addrs, TOPIC, "audit").await;
    let acked = take_acked(&mut sub, 25).await;
    assert_eq!(acked, (0..25).map(|i| format!("m{i}")).collect::<Vec<_>>());
    drop(sub);
    let _ = client.close().await;

    // Every node snapshots and drops the entries below (less the 8 it keeps).
    for index in 0..3 {
        wait_group(&mut cluster, index, "a compacted log", |g| {
            g["snapshot_index"].as_u64().is_some() && g["purged_index"].as_u64().is_some()
        });
    }

    // A follower is killed; the others compact well past where it stopped.
    let leader = group_of(&cluster, 0).unwrap()["leader"].as_u64().unwrap();
    let leader = cluster.index_of(leader);
    let victim = (0..3).find(|&i| i != leader).unwrap();
    let stopped_at = group_of(&cluster, victim).unwrap()["last_log_index"]
        .as_u64()
        .unwrap();
    cluster.kill(victim);
    common::cluster::publish_numbered(&addrs, TOPIC, 40, 60).await;
    let survivor = (0..3).find(|&i| i != victim).unwrap();
    wait_group(
        &mut cluster,
        survivor,
        "a log purged past the killed node",
        |g| g["purged_index"].as_u64().is_some_and(|p| p > stopped_at),
    );

    // Back, it can only catch up from a snapshot carrying the records it lacks.
    cluster.boot(victim);
    cluster.wait_serving(victim);
    let committed = group_of(&cluster, leader).unwrap()["applied_index"]
        .as_u64()
        .unwrap();
    wait_group(&mut cluster, victim, "caught up from a snapshot", |g| {
        g["applied_index"].as_u64().is_some_and(|a| a >= committed) && g["caught_up"] == true
    });
    assert_identical_logs(&mut cluster, 100);
    let victim_log = cluster.nodes[victim]
        .process
        .as_mut()
        .unwrap()
        .collect()
        .to_vec();
    assert!(
        victim_log
            .iter()
            .any(|l| l.contains("installed a snapshot")),
        "node {} caught up without a snapshot:\n{}",
        cluster.nodes[victim].id,
        victim_log.join("\n")
    );

    // Every node restarts from its own snapshot: same messages, the same acked cursor.
    for index in 0..3 {
        cluster.kill(index);
    }
    cluster.boot_all();
    for index in 0..3 {
        wait_group(&mut cluster, index, "a leader after the restart", |g| {
            g["leader"].as_u64().is_some() && g["caught_up"] == true
        });
    }
    common::cluster::publish_numbered(&addrs, TOPIC, 100, 1).await;
    for index in 0..3 {
        wait_group(&mut cluster, index, "the publish after the restart", |g| {
            g["caught_up"] == true
        });
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = partition_logs(&cluster.nodes, TOPIC, 1);
        if logs.iter().all(|l| l[0].len() == 101) || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_identical_logs(&mut cluster, 101);
    let (client, mut sub) = common::cluster::attach(&addrs, TOPIC, "audit").await;
    let rest = take_acked(&mut sub, 76).await;
    assert_eq!(
        rest,
        (25..101).map(|i| format!("m{i}")).collect::<Vec<_>>(),
        "after the restart the subscription goes on after the 25 acked, with nothing again"
    );
    let _ = client.close().await;
    let warnings = cluster.warnings();
    assert!(
        !warnings.contains("snapshot"),
        "snapshots logged trouble:\n{warnings}"
    );
}
