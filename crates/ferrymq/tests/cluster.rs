//! Three real `ferrymq serve` nodes on loopback, as an operator runs a cluster: a replicated
//! topic keeps every acknowledged publish through repeated kill -9 of its leader, each killed
//! node comes back and catches up, and a misconfigured node is refused with the reason.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{bodies_on, config, Cluster};
use common::{temp_dir, BIN};
use ferrymq_client::{Client, Message};

/// Creates the replicated topic `orders` (the default partitions) through the metadata leader.
async fn create_orders(addrs: &str) {
    common::cluster::create_topic(addrs, "orders", 0).await;
}

/// Publishes `body` through the leader of orders/0, reconnecting while a leader is elected.
/// `Ok` only when the cluster acknowledged it; gives up (as not acknowledged) after `limit`.
async fn publish_acknowledged(addrs: &str, client: &mut Option<Client>, body: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            *client = Client::connect_leader(config(addrs), Some("orders"), 0)
                .await
                .ok();
            if client.is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        }
        let attempt = client
            .as_ref()
            .unwrap()
            .publish("orders", Message::new(body.as_bytes().to_vec()))
            .await;
        match attempt {
            Ok(_) => return true,
            // Refused or unknown: this body is not acknowledged; the caller sends a new one.
            Err(e) => {
                eprintln!("publish {body}: {e}");
                *client = None;
                return false;
            }
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_publishes_survive_repeated_kill_9_of_the_leader() {
    let rounds: usize = std::env::var("FERRYMQ_CLUSTER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mut cluster = Cluster::start("cluster-kill", 3);
    let addrs = cluster.addrs();
    create_orders(&addrs).await;

    let mut acknowledged = Vec::new();
    let mut client = None;
    let mut failovers = Vec::new();
    let mut sent = 0usize;
    for round in 0..rounds {
        for _ in 0..25 {
            sent += 1;
            let body = format!("m{sent}");
            if publish_acknowledged(&addrs, &mut client, &body).await {
                acknowledged.push(body);
            }
        }
        // kill -9 the leader of orders/0, as the node the client reached sees it.
        let info = client.as_ref().unwrap().cluster_info().await.unwrap();
        let leader = info.partitions[0].leader;
        assert_ne!(leader, 0, "round {round}: no leader known: {info:?}");
        let index = cluster.index_of(leader);
        cluster.kill(index);
        client = None;
        let killed = Instant::now();
        // The first publish the new leader acknowledges ends the failover.
        loop {
            sent += 1;
            let body = format!("m{sent}");
            if publish_acknowledged(&addrs, &mut client, &body).await {
                acknowledged.push(body);
                break;
            }
            if killed.elapsed() > Duration::from_secs(30) {
                panic!(
                    "no new leader after 30 s; the nodes logged:\n{}",
                    cluster.warnings()
                );
            }
        }
        failovers.push(killed.elapsed());
        cluster.boot(index);
        cluster.nodes[index].process.as_mut().unwrap().tcp_addr();
    }
    println!("failovers: {failovers:?}");
    assert!(
        acknowledged.len() >= rounds * 25,
        "{} acknowledged of {sent}",
        acknowledged.len()
    );

    // Every node, the restarted ones included, ends with the same log holding every
    // acknowledged publish exactly once, in the order the cluster acknowledged them.
    let deadline = Instant::now() + Duration::from_secs(60);
    let logs: Vec<Vec<String>> = loop {
        let logs: Vec<Vec<String>> = cluster
            .nodes
            .iter()
            .map(|n| bodies_on(n, "orders", &format!("check-{}", n.id)))
            .collect();
        let complete = logs
            .iter()
            .all(|log| acknowledged.iter().all(|a| log.contains(a)));
        if complete && logs.windows(2).all(|w| w[0] == w[1]) {
            break logs;
        }
        assert!(Instant::now() < deadline, "replicas never agreed: {logs:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log = &logs[0];
    let positions: Vec<usize> = acknowledged
        .iter()
        .map(|a| {
            let found: Vec<usize> = (0..log.len()).filter(|&i| &log[i] == a).collect();
            assert_eq!(found.len(), 1, "{a} stored {} times", found.len());
            found[0]
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "acknowledged out of order"
    );
    for body in log {
        let n: usize = body[1..].parse().unwrap();
        assert!(n <= sent, "{body} was never sent");
    }
}

/// `GET /node` and `/metrics` of every node tell who leads each group and how far behind each
/// follower is, as the leader sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_reports_its_groups_on_node_and_metrics() {
    let mut cluster = Cluster::start("cluster-status", 3);
    create_orders(&cluster.addrs()).await;
    let https: Vec<SocketAddr> = cluster
        .nodes
        .iter_mut()
        .map(|n| n.process.as_mut().unwrap().http_addr())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes: Vec<serde_json::Value> = https
            .iter()
            .map(|addr| {
                let (status, body) = common::http(*addr, "GET", "/node", &[], b"");
                assert_eq!(status, 200);
                serde_json::from_slice(&body).unwrap()
            })
            .collect();
        let partition_groups = |n: &serde_json::Value| -> Vec<serde_json::Value> {
            n["cluster"]["groups"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|g| g["topic"] == "orders")
                .cloned()
                .collect()
        };
        let leaders: Vec<&serde_json::Value> = nodes
            .iter()
            .filter(|n| partition_groups(n).iter().any(|g| g["role"] == "leader"))
            .collect();
        let caught_up = leaders.len() == 1
            && partition_groups(leaders[0])[0]["followers"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["lag_entries"] == 0)
                .count()
                == 2;
        if caught_up {
            let leader = leaders[0];
            assert_eq!(leader["cluster"]["under_replicated"], 0, "{leader}");
            let id = leader["cluster"]["node_id"].as_u64().unwrap();
            for n in &nodes {
                assert_eq!(partition_groups(n).len(), 1, "{n}");
                assert_eq!(partition_groups(n)[0]["leader"], id, "{n}");
                assert_eq!(n["cluster"]["cluster_id"], "ferrymq");
            }
            let index = cluster.index_of(id);
            let (_, metrics) = common::http(https[index], "GET", "/metrics", &[], b"");
            let metrics = String::from_utf8(metrics).unwrap();
            assert!(
                metrics.contains(
                    "ferrymq_cluster_group_leader{group=\"1\",topic=\"orders\",partition=\"0\"} 1"
                ),
                "{metrics}"
            );
            assert!(metrics.contains("ferrymq_cluster_under_replicated_partitions 0"));
            assert!(metrics.contains("ferrymq_cluster_follower_lag_entries{group=\"1\""));
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no leader with both followers caught up: {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_data_directory_of_another_node_or_cluster_is_refused() {
    let mut cluster = Cluster::start("cluster-identity", 1);
    let peers = format!("7={}", cluster.nodes[0].cluster);
    let dir = cluster.nodes[0].dir.clone();
    cluster.kill(0);
    let output = Command::new(BIN)
        .args([
            "serve",
            "--data-dir",
            dir.to_str().unwrap(),
            "--tcp-addr",
            "127.0.0.1:0",
        ])
        .args(["--http-addr", "127.0.0.1:0", "--node-id", "7"])
        .args(["--cluster-addr", &peers[2..], "--peers", &peers])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("belongs to another node or cluster"),
        "{stderr}"
    );
    assert!(stderr.contains("node_id = 1"), "{stderr}");
}

#[test]
fn cluster_flags_that_cannot_work_are_refused_naming_what_to_fix() {
    for (args, expected) in [
        (vec!["--cluster-addr", "127.0.0.1:7999"], "need --node-id"),
        (
            vec![
                "--node-id",
                "1",
                "--cluster-addr",
                "127.0.0.1:7999",
                "--peers",
                "2=127.0.0.1:7998",
            ],
            "does not list this node (1)",
        ),
        (
            vec![
                "--node-id",
                "1",
                "--cluster-addr",
                "127.0.0.1:7999",
                "--peers",
                "1=127.0.0.1:7999,1=127.0.0.1:7998",
            ],
            "node 1 is listed twice",
        ),
        (
            vec![
                "--node-id",
                "1",
                "--cluster-addr",
                "127.0.0.1:7999",
                "--peers",
                "1=127.0.0.1:7990",
            ],
            "but --cluster-addr is 127.0.0.1:7999",
        ),
    ] {
        let dir = temp_dir("cluster-flags");
        let output = Command::new(BIN)
            .args([
                "serve",
                "--data-dir",
                dir.to_str().unwrap(),
                "--tcp-addr",
                "127.0.0.1:0",
            ])
            .args(["--http-addr", "127.0.0.1:0"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
