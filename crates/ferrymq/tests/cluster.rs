//! Three real `ferrymq serve` nodes on loopback, as an operator runs a cluster: a replicated
//! topic keeps every acknowledged publish through repeated kill -9 of its leader, each killed
//! node comes back and catches up, and a misconfigured node is refused with the reason.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{config, free_port, partition_log, partition_logs, Cluster};
use common::proxy::{LinkState, Mesh};
use common::{temp_dir, BIN};
use ferrymq_client::protocol::{OffsetRange, StartPosition};
use ferrymq_client::{Client, Message, SubscribeOptions, Subscription, TopicConfig};

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
        cluster.wait_serving(index);
    }
    println!("failovers: {failovers:?}");
    let mut sorted = failovers.clone();
    sorted.sort();
    // Nearest rank: the 99th percentile of 20 is the largest.
    let p99 = sorted[(sorted.len() * 99).div_ceil(100) - 1];
    println!(
        "failovers: {} rounds, median {:?}, p99 {p99:?}, max {:?}",
        sorted.len(),
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1]
    );
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
            .map(|n| partition_log(n, "orders", 0))
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

/// Connects to the leader of orders/0 and attaches to subscription `work`, retrying (bounded)
/// while a leader is elected.
async fn work_consumer(addrs: &str) -> (Client, Subscription) {
    common::cluster::attach(addrs, "orders", "work").await
}

/// Publishes `message` to orders, retrying (bounded) while the leader reached is still taking
/// over (`not_leader` from the leader itself).
async fn publish_retrying(client: &Client, message: Message) -> ferrymq_client::MessageId {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.publish("orders", message.clone()).await {
            Ok(id) => return id,
            Err(e) if Instant::now() < deadline && e.to_string().contains("retry") => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("publish failed: {e}"),
        }
    }
}

/// The next delivery of `subscription`, or `None` when nothing comes within `wait`.
async fn next_within(
    subscription: &mut Subscription,
    wait: Duration,
) -> Option<ferrymq_client::protocol::Delivery> {
    match tokio::time::timeout(wait, subscription.next()).await {
        Ok(Some(Ok(delivery))) => Some(delivery),
        Ok(Some(Err(e))) => panic!("delivery failed: {e}"),
        Ok(None) | Err(_) => None,
    }
}

/// A consumer's acks, nacks and attempts and a publisher's deduplication ids live through kill -9
/// of the partition's leader: the next leader delivers none of the acked messages again, holds
/// the nacked one until its delay is over and counts its attempts on, and recognises a retried
/// publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_nacks_and_dedup_ids_survive_kill_9_of_the_leader() {
    let mut cluster = Cluster::start("cluster-cursors", 3);
    let addrs = cluster.addrs();
    create_orders(&addrs).await;
    let publisher = Client::connect_leader(config(&addrs), Some("orders"), 0)
        .await
        .unwrap();
    let mut first_ids = Vec::new();
    for i in 0..40 {
        let message = Message::new(format!("w{i}").into_bytes()).with_dedup_id(format!("id-{i}"));
        first_ids.push(publish_retrying(&publisher, message).await);
    }
    let _ = publisher.close().await;

    // Ack 20 with confirmation and nack one with a delay; the rest stay unsettled.
    let (client, mut work) = work_consumer(&addrs).await;
    let mut acked = Vec::new();
    let mut nacked = None;
    while acked.len() < 20 || nacked.is_none() {
        let d = next_within(&mut work, Duration::from_secs(10))
            .await
            .expect("a delivery");
        let body = String::from_utf8(d.message.body.to_vec()).unwrap();
        if nacked.is_none() && acked.len() == 10 {
            work.nack(&d, Duration::from_secs(4)).await.unwrap();
            nacked = Some((body, Instant::now()));
            continue;
        }
        work.ack_confirmed(&[OffsetRange::single(d.partition, d.offset)])
            .await
            .unwrap();
        acked.push(body);
    }
    let (nacked, nacked_at) = nacked.unwrap();
    drop(work);
    let _ = client.close().await;

    let leader = {
        let any = Client::connect_with(config(&addrs)).await.unwrap();
        let info = any.cluster_info().await.unwrap();
        info.partitions[0].leader
    };
    let index = cluster.index_of(leader);
    cluster.kill(index);
    let killed = Instant::now();

    // The next leader: every message not acked comes, none that was.
    let (client, mut work) = work_consumer(&addrs).await;
    eprintln!(
        "consumer attached to the next leader {:?} after the kill",
        killed.elapsed()
    );
    let mut seen: Vec<String> = Vec::new();
    let mut nacked_attempt = None;
    while seen.len() < 20 {
        let Some(d) = next_within(&mut work, Duration::from_secs(20)).await else {
            panic!(
                "only {} of 20 came after the failover: {seen:?}; nodes:\n{}",
                seen.len(),
                cluster.warnings()
            );
        };
        let body = String::from_utf8(d.message.body.to_vec()).unwrap();
        assert!(!acked.contains(&body), "{body} was acked, and came again");
        if body == nacked {
            assert!(
                nacked_at.elapsed() >= Duration::from_millis(3900),
                "{body} came back {:?} after a nack of 4 s",
                nacked_at.elapsed()
            );
            nacked_attempt = Some(d.attempt);
        }
        work.ack_confirmed(&[OffsetRange::single(d.partition, d.offset)])
            .await
            .unwrap();
        if !seen.contains(&body) {
            seen.push(body);
        }
    }
    assert!(
        nacked_attempt.is_some_and(|a| a >= 2),
        "the nacked message came with attempt {nacked_attempt:?}"
    );

    // A retried publish is recognised by the next leader: it answers with the first copy.
    let publisher = Client::connect_leader(config(&addrs), Some("orders"), 0)
        .await
        .unwrap();
    let retry = Message::new(b"w7".to_vec()).with_dedup_id("id-7");
    let id = publish_retrying(&publisher, retry).await;
    assert_eq!(
        id, first_ids[7],
        "a retry after the failover was stored again"
    );
    let _ = publisher.close().await;
    drop(work);
    let _ = client.close().await;
}

/// A connection to the leader of each of the first `partitions` partitions of orders, none of
/// them node `not` (bounded wait while leaders are elected).
async fn leaders_of_orders(addrs: &str, partitions: u32, not: Option<u64>) -> Vec<Client> {
    let mut list = Vec::new();
    for p in 0..partitions {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(c) = Client::connect_leader(config(addrs), Some("orders"), p).await {
                let info = c.cluster_info().await;
                let leads = info.is_ok_and(|i| {
                    Some(i.node_id) != not
                        && i.partitions.iter().any(|x| {
                            x.topic == "orders" && x.partition == p && x.leader == i.node_id
                        })
                });
                if leads {
                    list.push(c);
                    break;
                }
            }
            assert!(Instant::now() < deadline, "no leader of partition {p}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    list
}

/// Publishes `r<round>-<i>` for i in 0..30 to partition i % 3, through each partition's
/// leader, with dedup ids, retrying (bounded) while a leader takes over.
async fn publish_round(publishers: &[Client], round: usize) {
    for i in 0..30 {
        let p = i % 3;
        let body = format!("r{round}-{i}");
        let message = Message::new(body.clone().into_bytes()).with_dedup_id(body);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let attempt = publishers[p]
                .publish_batch("orders", Some(p as u32), std::slice::from_ref(&message))
                .await;
            match attempt {
                Ok(_) => break,
                Err(e) => {
                    assert!(Instant::now() < deadline, "publish {i}: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// A subscription attached on every node reads every partition of a topic whose leaders are
/// spread over the nodes, goes on through kill -9 of a leader without delivering again what it
/// acked with confirmation, and `ferrymq sub` given one node's address reads every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_subscription_reads_every_partition_through_a_failover() {
    let mut cluster = Cluster::start("cluster-subscription", 3);
    let addrs = cluster.addrs();
    common::cluster::create_topic(&addrs, "orders", 3).await;
    let publishers = leaders_of_orders(&addrs, 3, None).await;
    publish_round(&publishers, 0).await;

    // `ferrymq sub` through one node reads all three partitions.
    let output = std::process::Command::new(BIN)
        .args(["sub", "orders", "--addr", &cluster.nodes[0].tcp.to_string()])
        .args([
            "--from",
            "earliest",
            "--subscription",
            "cli",
            "--count",
            "30",
        ])
        .args(["--timeout", "20s"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout).lines().count(), 30);

    let options = SubscribeOptions::new("orders")
        .subscription("all")
        .start(StartPosition::Earliest);
    let mut all = Client::subscribe_cluster(config(&addrs), options)
        .await
        .unwrap();
    let mut acked: Vec<String> = Vec::new();
    while acked.len() < 30 {
        let d = tokio::time::timeout(Duration::from_secs(20), all.next())
            .await
            .expect("a delivery within 20 s")
            .unwrap()
            .unwrap();
        all.ack_confirmed(&[OffsetRange::single(d.partition, d.offset)])
            .await
            .unwrap();
        acked.push(String::from_utf8(d.message.body.to_vec()).unwrap());
    }
    let info = publishers[0].cluster_info().await.unwrap();
    let leader = info
        .partitions
        .iter()
        .find(|p| p.topic == "orders" && p.partition == 0)
        .unwrap()
        .leader;
    cluster.kill(cluster.index_of(leader));
    drop(publishers);
    let publishers = leaders_of_orders(&addrs, 3, Some(leader)).await;
    publish_round(&publishers, 1).await;
    let mut after: Vec<String> = Vec::new();
    while after.len() < 30 {
        let Ok(next) = tokio::time::timeout(Duration::from_secs(20), all.next()).await else {
            panic!(
                "{} of 30 after the kill: {after:?}\n{}",
                after.len(),
                cluster.warnings()
            );
        };
        let d = next.unwrap().unwrap();
        let body = String::from_utf8(d.message.body.to_vec()).unwrap();
        assert!(
            !acked.contains(&body),
            "{body} was acked with confirmation, and came again"
        );
        let _ = all
            .ack_confirmed(&[OffsetRange::single(d.partition, d.offset)])
            .await;
        if !after.contains(&body) {
            after.push(body);
        }
    }
    assert!(after.iter().all(|b| b.starts_with("r1-")), "{after:?}");
    all.close().await.unwrap();
}

/// `replicas` is a topic setting: the cluster's default is 3 of 3 nodes, 1 keeps one copy, and
/// more than the nodes is refused naming both; a broker running alone refuses 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_are_a_topic_setting_bounded_by_the_nodes() {
    let cluster = Cluster::start("cluster-replicas", 3);
    let addrs = cluster.addrs();
    create_orders(&addrs).await;
    let admin = Client::connect_leader(config(&addrs), None, 0)
        .await
        .unwrap();
    let with = |replicas| TopicConfig {
        replicas,
        ..TopicConfig::default()
    };
    admin.create_topic("solo", with(1), false).await.unwrap();
    let refused = admin
        .create_topic("five", with(5), false)
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("5, but the cluster has 3 node(s)"),
        "{refused}"
    );
    let info = admin.cluster_info().await.unwrap();
    let solo: Vec<_> = info
        .partitions
        .iter()
        .filter(|p| p.topic == "solo")
        .collect();
    assert_eq!(solo.len(), 1);
    assert_eq!(solo[0].replicas.len(), 1, "{info:?}");
    assert_eq!(
        admin.describe_topic("solo").await.unwrap().config.replicas,
        1
    );
    assert_eq!(
        admin
            .describe_topic("orders")
            .await
            .unwrap()
            .config
            .replicas,
        3
    );
    let _ = admin.close().await;

    let alone = temp_dir("cluster-replicas-alone");
    let mut single = common::Served::start_in(&alone, &[], &[]);
    let addr = single.tcp_addr().to_string();
    let output = Command::new(BIN)
        .args([
            "topic",
            "create",
            "orders",
            "--replicas",
            "3",
            "--addr",
            &addr,
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("runs alone and keeps one copy"), "{stderr}");
}

/// `GET /node` and `/metrics` of every node tell who leads each group and how far behind each
/// follower is, as the leader sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_reports_its_groups_on_node_and_metrics() {
    let cluster = Cluster::start("cluster-status", 3);
    create_orders(&cluster.addrs()).await;
    let https: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http.unwrap()).collect();
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

/// The value of header `name` in a response head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Sends an HTTP request until it gets an answer other than 503 (no leader elected yet),
/// bounded; the status, head and body of that answer.
fn http_past_elections(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, String, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let json = [("Content-Type", "application/json")];
    loop {
        let (status, head, reply) = common::http_with_head(addr, method, path, &json, body);
        let reply = String::from_utf8_lossy(&reply).into_owned();
        if status != 503 || Instant::now() >= deadline {
            return (status, head, reply);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every node serves the HTTP API for replicated topics: a topic created, published to (with and
/// without an idempotency key) and deleted through any node reaches the metadata group's and the
/// partitions' leaders; each answer names the node that served it, and every replica holds each
/// message once, in the order it was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_on_any_node_reaches_the_leaders() {
    let cluster = Cluster::start("cluster-http", 3);
    let https: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http.unwrap()).collect();
    let ids: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();

    let create = br#"{"name":"events","partitions":2}"#;
    let (status, head, reply) = http_past_elections(https[1], "POST", "/topics", create);
    assert_eq!(status, 201, "{head}\n{reply}");
    let creator: u64 = header(&head, "ferrymq-node").unwrap().parse().unwrap();
    assert!(ids.contains(&creator), "{head}");
    // Created through the metadata group: every node has it, replicated.
    for http in &https {
        let (status, body) = common::http(*http, "GET", "/topics/events", &[], b"");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }

    // Each node publishes messages of both partitions (by key) and a retried idempotent one.
    let mut sent = vec![Vec::new(), Vec::new()];
    // Two partitions on three nodes: at least one node leads neither and passes its publishes on.
    let mut forwarded = 0;
    for (i, http) in https.iter().enumerate() {
        for k in 0..4 {
            let body = format!("n{i}-{k}");
            let batch = format!(r#"{{"messages":[{{"body":"{body}","key":"k{k}"}}]}}"#);
            let path = "/topics/events/messages";
            let (status, head, reply) = http_past_elections(*http, "POST", path, batch.as_bytes());
            assert_eq!(status, 201, "{head}\n{reply}");
            let served: u64 = header(&head, "ferrymq-node").unwrap().parse().unwrap();
            assert!(ids.contains(&served), "{head}");
            forwarded += usize::from(served != ids[i]);
            let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
            let id = reply["ids"][0].as_str().unwrap();
            let partition: usize = id.split('-').next().unwrap().parse().unwrap();
            sent[partition].push(body);
        }
        let key = format!("retry-{i}");
        let headers = [("Idempotency-Key", key.as_str())];
        let path = "/topics/events/messages?partition=0";
        let (first_status, first) = common::http(*http, "POST", path, &headers, b"once");
        assert_eq!(first_status, 201, "{}", String::from_utf8_lossy(&first));
        let (status, again) = common::http(https[(i + 1) % 3], "POST", path, &headers, b"once");
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&again));
        let first: serde_json::Value = serde_json::from_slice(&first).unwrap();
        let again: serde_json::Value = serde_json::from_slice(&again).unwrap();
        assert_eq!(again["ids"], first["ids"], "the retry is the first copy");
        assert_eq!(again["duplicates"], first["ids"], "{again}");
        sent[0].push("once".to_owned());
    }
    assert!(forwarded >= 4, "publishes passed to a leader: {forwarded}");

    // Consuming over HTTP on a node that leads neither partition: passed on to the leaders, the
    // answer naming them; the leader of partition 0 serves it too.
    let groups = |http: SocketAddr| -> Vec<serde_json::Value> {
        let (_, node) = common::http(http, "GET", "/node", &[], b"");
        let node: serde_json::Value = serde_json::from_slice(&node).unwrap();
        node["cluster"]["groups"].as_array().unwrap().clone()
    };
    let leads_any = |http: SocketAddr| {
        groups(http)
            .iter()
            .any(|g| g["topic"] == "events" && g["role"] == "leader")
    };
    let idle_index = https.iter().position(|h| !leads_any(*h)).unwrap();
    let idle = https[idle_index];
    let anywhere = "/topics/events/subscriptions/anywhere/poll?start=earliest&wait_ms=500&max=100";
    let mut polled = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while polled < sent[0].len() + sent[1].len() {
        assert!(Instant::now() < deadline, "polled {polled}");
        let (status, head, reply) = common::http_with_head(idle, "POST", anywhere, &[], b"");
        let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
        assert_eq!(status, 200, "{head}\n{reply}");
        assert!(!served_by(&head).contains(&ids[idle_index]), "{head}");
        polled += reply["messages"].as_array().unwrap().len();
    }
    let poll = "/topics/events/subscriptions/workers/poll?start=earliest&wait_ms=0";
    let leader_of_0 = groups(https[0])
        .iter()
        .find(|g| g["topic"] == "events" && g["partition"] == 0)
        .and_then(|g| g["leader"].as_u64())
        .unwrap();
    let at_leader = https[cluster.index_of(leader_of_0)];
    let poll_0 = format!("{poll}&partitions=0&max=100");
    let (status, reply) = common::http(at_leader, "POST", &poll_0, &[], b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(
        reply["messages"].as_array().unwrap().len(),
        sent[0].len(),
        "{reply}"
    );

    // Every replica holds each acknowledged message once, in acknowledgement order.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = partition_logs(&cluster.nodes, "events", 2);
        if logs.iter().all(|node| *node == sent) {
            break;
        }
        assert!(Instant::now() < deadline, "sent {sent:?}, logs {logs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The leader of partition 0 killed: a survivor that does not lead it passes a publish on to
    // the next leader once one is elected.
    let (_, node) = common::http(https[0], "GET", "/node", &[], b"");
    let node: serde_json::Value = serde_json::from_slice(&node).unwrap();
    let leader = node["cluster"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["topic"] == "events" && g["partition"] == 0)
        .and_then(|g| g["leader"].as_u64())
        .unwrap();
    let mut cluster = cluster;
    let killed = cluster.index_of(leader);
    cluster.kill(killed);
    let survivor = (killed + 1) % 3;
    let headers = [("Idempotency-Key", "after-kill")];
    let path = "/topics/events/messages?partition=0";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, head, reply) =
            common::http_with_head(https[survivor], "POST", path, &headers, b"after");
        if status == 201 {
            assert!(
                header(&head, "ferrymq-node") != Some(&leader.to_string()),
                "{head}"
            );
            break;
        }
        let reply = String::from_utf8_lossy(&reply);
        assert!(
            status == 503 && Instant::now() < deadline,
            "{head}\n{reply}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sent[0].push("after".to_owned());
    let deadline = Instant::now() + Duration::from_secs(30);
    for (i, node) in cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != killed)
    {
        while partition_log(node, "events", 0) != sent[0] {
            assert!(
                Instant::now() < deadline,
                "node {i}: {:?}",
                partition_log(node, "events", 0)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Deleted through a node that is not the metadata leader (or is) while the killed node is
    // down: gone everywhere, on the killed node too once it is back.
    let (status, head, reply) =
        http_past_elections(https[survivor], "DELETE", "/topics/events", b"");
    assert_eq!(status, 204, "{head}\n{reply}");
    assert!(header(&head, "ferrymq-node").is_some(), "{head}");
    cluster.boot(killed);
    cluster.wait_serving(killed);
    let https: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http.unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    for http in &https {
        loop {
            let (status, _) = common::http(*http, "GET", "/topics/events", &[], b"");
            if status == 404 {
                break;
            }
            assert!(Instant::now() < deadline, "still there on {http}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `GET /cluster` on a node, parsed, once it answers 200.
fn cluster_page(http: SocketAddr) -> serde_json::Value {
    let (status, body) = common::http(http, "GET", "/cluster", &[], b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// `GET /cluster` on any node shows every node with its version and resources, each
/// partition's leader, replicas and followers, and the elections the node saw; with a node
/// killed, the page on a survivor shows it down, with why, and its partitions under-replicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_page_shows_nodes_partitions_and_elections() {
    let mut cluster = Cluster::start("cluster-page", 3);
    create_orders(&cluster.addrs()).await;
    let https: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http.unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = cluster_page(https[2]);
        let healthy = page["under_replicated"] == 0
            && page["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n["up"] == true)
            && page["partitions"][0]["leader"].is_u64();
        // The node notes leader changes at its gate's pass, every 20 ms.
        let seen = page["elections"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["topic"] == "orders" && e["leader"] == page["partitions"][0]["leader"]);
        if healthy && seen {
            break page;
        }
        assert!(Instant::now() < deadline, "never healthy: {page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(page["node_id"], cluster.nodes[2].id, "{page}");
    assert!(page["metadata_leader"].is_u64(), "{page}");
    for (node, planned) in page["nodes"].as_array().unwrap().iter().zip(&cluster.nodes) {
        assert_eq!(node["id"], planned.id, "{page}");
        assert_eq!(node["addr"], planned.tcp.to_string(), "{page}");
        assert!(
            node["version"].is_string() && node["uptime_ms"].is_u64(),
            "{node}"
        );
        assert!(node["disk_available_bytes"].as_u64().unwrap() > 0, "{node}");
        assert!(node["resident_bytes"].as_u64().unwrap() > 0, "{node}");
        assert_eq!(node["replica_of"], 1, "{node}");
    }
    let partition = &page["partitions"][0];
    assert_eq!(partition["topic"], "orders");
    assert_eq!(partition["replicas"].as_array().unwrap().len(), 3, "{page}");
    let leader = partition["leader"].as_u64().unwrap();
    let followers: Vec<u64> = partition["followers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["node"].as_u64().unwrap())
        .collect();
    assert_eq!(followers.len(), 2, "{page}");
    assert!(!followers.contains(&leader), "{page}");
    let led: u64 = page["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["leader_of"].as_u64().unwrap())
        .sum();
    assert_eq!(led, 1, "{page}");
    let elections = page["elections"].as_array().unwrap();
    assert!(
        elections
            .iter()
            .any(|e| e["topic"] == "orders" && e["leader"] == leader),
        "{page}"
    );

    // The partition's leader killed: a survivor's page shows it down, the partition
    // under-replicated, and the new leader's election.
    let killed = cluster.index_of(leader);
    cluster.kill(killed);
    let survivor = https[(killed + 1) % 3];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page = cluster_page(survivor);
        let node = &page["nodes"][killed];
        let partition = &page["partitions"][0];
        let new_leader = partition["leader"].as_u64().filter(|l| *l != leader);
        let elected = new_leader.is_some_and(|l| {
            page["elections"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["topic"] == "orders" && e["leader"] == l)
        });
        if node["up"] == false && elected && partition["under_replicated"] == true {
            assert!(
                node["error"]
                    .as_str()
                    .unwrap()
                    .contains(&leader.to_string()),
                "{page}"
            );
            assert!(node["version"].is_null(), "{page}");
            assert!(page["under_replicated"].as_u64().unwrap() >= 1, "{page}");
            break;
        }
        assert!(Instant::now() < deadline, "the page never told: {page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /readyz` of node `index`: its status and reasons (empty when it answers none).
fn readyz(cluster: &Cluster, index: usize) -> (u16, Vec<String>) {
    let (status, body) = common::http(
        cluster.nodes[index].http.unwrap(),
        "GET",
        "/readyz",
        &[],
        b"",
    );
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let reasons = json["reasons"].as_array().cloned().unwrap_or_default();
    (
        status,
        reasons
            .iter()
            .map(|r| r.as_str().unwrap().to_owned())
            .collect(),
    )
}

/// Polls (bounded) until node `index` says it is ready.
fn wait_ready(cluster: &Cluster, index: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, reasons) = readyz(cluster, index);
        if status == 200 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {} still not ready: {reasons:?}",
            index + 1
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// This node's group of `topic` (the metadata group for `None`) in its `GET /node`.
fn node_group(cluster: &Cluster, index: usize, topic: Option<&str>) -> serde_json::Value {
    let (status, body) = common::http(cluster.nodes[index].http.unwrap(), "GET", "/node", &[], b"");
    assert_eq!(status, 200);
    let node: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let groups = node["cluster"]["groups"].as_array().unwrap().clone();
    let wanted = topic.map_or(serde_json::Value::Null, serde_json::Value::from);
    groups
        .into_iter()
        .find(|g| g["topic"] == wanted)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_until_the_node_joined_and_caught_up() {
    // Peers named by host name: each connection looks `localhost` up.
    let mut cluster = Cluster::plan("cluster-readyz", 3);
    let peers = cluster
        .nodes
        .iter()
        .map(|n| format!("{}=localhost:{}", n.id, n.cluster.port()))
        .collect::<Vec<_>>()
        .join(",");
    for node in &mut cluster.nodes {
        node.peers = peers.clone();
    }
    // Alone, a node serves but is not ready: its metadata group has no leader.
    cluster.boot(0);
    cluster.wait_serving(0);
    let (status, reasons) = readyz(&cluster, 0);
    assert_eq!(status, 503, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("cluster: the metadata group")),
        "{reasons:?}"
    );

    cluster.boot(1);
    cluster.boot(2);
    cluster.wait_serving(1);
    cluster.wait_serving(2);
    for i in 0..3 {
        wait_ready(&cluster, i);
    }
    let addrs = cluster.addrs();
    create_orders(&addrs).await;
    let mut client = None;
    let mut acked = 0;
    for i in 0..30 {
        acked += publish_acknowledged(&addrs, &mut client, &format!("before-{i}")).await as u32;
    }
    assert!(acked > 0, "nothing acknowledged before the kill");

    // kill -9 of a node that does not lead orders/0; the others go on taking writes.
    let leader = node_group(&cluster, 0, Some("orders"))["leader"]
        .as_u64()
        .unwrap();
    let victim = (0..3).find(|i| cluster.nodes[*i].id != leader).unwrap();
    cluster.kill(victim);
    for i in 0..50 {
        publish_acknowledged(&addrs, &mut client, &format!("during-{i}")).await;
    }
    let leader_index = cluster.index_of(leader);
    let committed = node_group(&cluster, leader_index, Some("orders"))["applied_index"]
        .as_u64()
        .unwrap();

    // Back: ready again only once it has applied what the leaders committed meanwhile.
    cluster.boot(victim);
    cluster.wait_serving(victim);
    wait_ready(&cluster, victim);
    let metadata = node_group(&cluster, victim, None);
    assert_eq!(metadata["caught_up"], true, "{metadata}");
    if metadata["role"] != "leader" {
        assert!(
            metadata["applied_index"].as_u64() >= metadata["leader_commit"].as_u64(),
            "{metadata}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let orders = node_group(&cluster, victim, Some("orders"));
        if orders["applied_index"].as_u64() >= Some(committed) {
            assert!(orders["leader"].is_u64(), "{orders}");
            break;
        }
        if Instant::now() >= deadline {
            let (_, body) = common::http(
                cluster.nodes[victim].http.unwrap(),
                "GET",
                "/node",
                &[],
                b"",
            );
            let node: serde_json::Value = serde_json::from_slice(&body).unwrap();
            panic!(
                "orders/0 never caught up to {committed}: {}",
                node["cluster"]
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some(c) = client {
        let _ = c.close().await;
    }

    // Restarted while its peers are down, it is not ready: it has heard from no leader.
    for i in 0..3 {
        cluster.kill(i);
    }
    cluster.boot(victim);
    cluster.wait_serving(victim);
    let (status, reasons) = readyz(&cluster, victim);
    assert_eq!(status, 503, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("cluster: the metadata group")),
        "{reasons:?}"
    );
}

/// A binary-protocol publish sent to any node, the broker choosing each message's partition by
/// its key, is stored at each partition's leader: a node passes the parts it does not lead on,
/// so a client that does not follow leaders (or cannot know which partition a key picks) is
/// served, and every replica holds each message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_to_any_node_reaches_each_partitions_leader() {
    let cluster = Cluster::start("cluster-any-node", 3);
    common::cluster::create_topic(&cluster.addrs(), "spread", 3).await;
    let mut sent: Vec<Vec<String>> = vec![Vec::new(); 3];
    for node in &cluster.nodes {
        let client = Client::connect_with(config(&node.tcp.to_string()))
            .await
            .unwrap();
        for k in 0..6 {
            let body = format!("n{}-k{k}", node.id);
            let message = Message::new(body.as_bytes().to_vec()).with_key(format!("key-{k}"));
            let id = client.publish("spread", message).await.unwrap();
            sent[id.partition as usize].push(body);
        }
        let _ = client.close().await;
    }
    assert!(
        sent.iter().filter(|p| !p.is_empty()).count() >= 2,
        "{sent:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = partition_logs(&cluster.nodes, "spread", 3);
        if logs.iter().all(|node| *node == sent) {
            break;
        }
        assert!(Instant::now() < deadline, "sent {sent:?}, logs {logs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The leader of each of the `partitions` partitions of `topic`, as `GET /cluster` on `http`
/// shows them once every one has a leader (bounded).
fn wait_leaders(http: SocketAddr, topic: &str, partitions: usize) -> Vec<u64> {
    wait_leaders_seen(&[http], topic, partitions)
}

/// As [`wait_leaders`], each partition's leader as any of `https` knows it (a node holding no
/// replica of a partition does not know its leader).
fn wait_leaders_seen(https: &[SocketAddr], topic: &str, partitions: usize) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut leaders: Vec<Option<u64>> = vec![None; partitions];
        for http in https {
            let page = cluster_page(*http);
            for p in page["partitions"].as_array().unwrap() {
                let index = p["partition"].as_u64().unwrap() as usize;
                if p["topic"] == topic && index < partitions && leaders[index].is_none() {
                    leaders[index] = p["leader"].as_u64();
                }
            }
        }
        if leaders.iter().all(Option::is_some) {
            return leaders.into_iter().flatten().collect();
        }
        assert!(Instant::now() < deadline, "{topic}: leaders {leaders:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The nodes a `FerryMQ-Node` header names.
fn served_by(head: &str) -> Vec<u64> {
    header(head, "ferrymq-node")
        .unwrap_or_else(|| panic!("no FerryMQ-Node in {head}"))
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect()
}

/// Publishes `body` to partition `partition` of `topic` through `http`, retried (bounded) while
/// a leader is elected.
fn publish_to(http: SocketAddr, topic: &str, partition: u32, body: &str) {
    let path = format!("/topics/{topic}/messages?partition={partition}");
    let message = format!(r#"{{"body":"{body}"}}"#);
    let (status, head, reply) = http_past_elections(http, "POST", &path, message.as_bytes());
    assert_eq!(status, 201, "{head}\n{reply}");
}

/// A JSON request to `http`: status, head and the reply parsed (`null` when not JSON).
fn http_json(http: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String, Value) {
    let json = [("Content-Type", "application/json")];
    let (status, head, reply) = common::http_with_head(http, method, path, &json, body.as_bytes());
    let parsed = serde_json::from_slice(&reply).unwrap_or(Value::Null);
    (status, head, parsed)
}

use serde_json::Value;

/// A Server-Sent Events response read on a thread: its text so far, and whether the server
/// ended it.
struct SseReader {
    chunks: std::sync::mpsc::Receiver<Option<String>>,
    text: String,
    ended: bool,
}

impl SseReader {
    fn open(http: SocketAddr, path: &str) -> SseReader {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(http).unwrap();
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {http}\r\nAccept: text/event-stream\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let (tx, chunks) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                match stream.read(&mut buf) {
                    Ok(n) if n > 0 => {
                        let chunk = String::from_utf8_lossy(&buf[..n]).into_owned();
                        if tx.send(Some(chunk)).is_err() {
                            return;
                        }
                    }
                    _ => {
                        let _ = tx.send(None);
                        return;
                    }
                }
            }
        });
        SseReader {
            chunks,
            text: String::new(),
            ended: false,
        }
    }

    /// Reads until `done` holds of the text, the stream ends, or `within` passes; whether
    /// `done` holds.
    fn read_until(&mut self, within: Duration, done: impl Fn(&SseReader) -> bool) -> bool {
        let deadline = Instant::now() + within;
        while !done(self) && !self.ended {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(Some(chunk)) => self.text.push_str(&chunk),
                Ok(None) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    self.ended = true
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break,
            }
        }
        done(self)
    }

    /// The JSON data of every event of kind `event` so far.
    fn events(&self, event: &str) -> Vec<Value> {
        let mut found = Vec::new();
        let mut kind = "";
        for line in self.text.lines() {
            if let Some(name) = line.strip_prefix("event: ") {
                kind = name.trim();
            } else if let Some(data) = line.strip_prefix("data: ") {
                if kind == event {
                    if let Ok(value) = serde_json::from_str(data) {
                        found.push(value);
                    }
                }
            }
        }
        found
    }
}

/// A poll of `topic`/`subscription` sent to any node reaches the leaders of the partitions it
/// reads, spread over the nodes: each answer names the nodes that served it in `FerryMQ-Node`,
/// and its token takes acks and nacks through any other node. An acked message is never
/// delivered again, past its ack timeout too; a nacked one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_polls_and_acks_through_any_node() {
    let cluster = Cluster::start("cluster-http-consume", 3);
    let https: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http.unwrap()).collect();
    let ids: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();
    let create = br#"{"name":"jobs","partitions":3}"#;
    let (status, head, reply) = http_past_elections(https[0], "POST", "/topics", create);
    assert_eq!(status, 201, "{head}\n{reply}");
    let leaders = wait_leaders(https[0], "jobs", 3);
    let mut sent = Vec::new();
    for i in 0..30u32 {
        let body = format!("job-{i}");
        publish_to(https[i as usize % 3], "jobs", i % 3, &body);
        sent.push(body);
    }

    // Polled through a node that does not lead every partition: the others' are passed on.
    let poller = (0..3)
        .find(|&i| leaders.iter().any(|l| *l != ids[i]))
        .unwrap();
    let poll = "/topics/jobs/subscriptions/workers/poll?start=earliest&max=7&wait_ms=2000&ack_timeout_ms=2000";
    let mut received: Vec<(String, String, String)> = Vec::new();
    let mut elsewhere = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.len() < sent.len() {
        assert!(Instant::now() < deadline, "received {received:?}");
        let (status, head, reply) = http_json(https[poller], "POST", poll, "");
        assert_eq!(status, 200, "{head}\n{reply}");
        let served = served_by(&head);
        assert!(served.iter().all(|n| ids.contains(n)), "{head}");
        elsewhere |= served.iter().any(|n| *n != ids[poller]);
        let messages = reply["messages"].as_array().unwrap();
        assert!(messages.len() <= 7, "{reply}");
        let token = reply["consumer"].as_str().unwrap();
        for m in messages {
            let id = m["id"].as_str().unwrap().to_owned();
            let body = m["body"].as_str().unwrap().to_owned();
            received.push((id, body, token.to_owned()));
        }
    }
    assert!(elsewhere, "no poll was passed on to another leader");
    let mut bodies: Vec<&str> = received.iter().map(|r| r.1.as_str()).collect();
    bodies.sort_unstable();
    let mut expected: Vec<&str> = sent.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(bodies, expected, "each message once");

    // Each acked through another node than the one polled, one nacked.
    let (nacked, acked) = received.split_first().unwrap();
    for (k, (id, _, token)) in acked.iter().enumerate() {
        let through = https[(poller + 1 + k % 2) % 3];
        let ack = format!(r#"{{"consumer":"{token}","ids":["{id}"]}}"#);
        let path = "/topics/jobs/subscriptions/workers/ack";
        let (status, head, reply) = http_json(through, "POST", path, &ack);
        assert_eq!(status, 200, "{head}\n{reply}");
        assert_eq!(reply["acked"], 1, "{id}: {reply}");
        assert!(!served_by(&head).is_empty(), "{head}");
    }
    let nack = format!(r#"{{"consumer":"{}","ids":["{}"]}}"#, nacked.2, nacked.0);
    let path = "/topics/jobs/subscriptions/workers/nack";
    let (status, head, reply) = http_json(https[(poller + 1) % 3], "POST", path, &nack);
    assert_eq!(status, 200, "{head}\n{reply}");
    assert_eq!(reply["released"], 1, "{reply}");

    // A token that names no consumer is refused, as on a single node.
    let bogus = r#"{"consumer":"9:cdeadbeef","ids":["0-0"]}"#;
    let (status, _, reply) = http_json(
        https[0],
        "POST",
        "/topics/jobs/subscriptions/workers/ack",
        bogus,
    );
    assert!(status == 404 || status == 503, "{reply}");

    // Past the ack timeout, only the nacked message comes again, through any node.
    let again_until = Instant::now() + Duration::from_secs(4);
    let mut again = Vec::new();
    while Instant::now() < again_until || again.is_empty() {
        assert!(
            Instant::now() < deadline + Duration::from_secs(30),
            "{again:?}"
        );
        let through = https[(poller + 2) % 3];
        let (status, head, reply) = http_json(through, "POST", poll, "");
        assert_eq!(status, 200, "{head}\n{reply}");
        let token = reply["consumer"].as_str().unwrap();
        for m in reply["messages"].as_array().unwrap() {
            let id = m["id"].as_str().unwrap().to_owned();
            assert!(m["attempt"].as_u64().unwrap() >= 2, "{m}");
            let ack = format!(r#"{{"consumer":"{token}","ids":["{id}"]}}"#);
            let path = "/topics/jobs/subscriptions/workers/ack";
            let (status, head, reply) = http_json(https[poller], "POST", path, &ack);
            assert_eq!(status, 200, "{head}\n{reply}");
            again.push(id);
        }
    }
    assert_eq!(
        again,
        vec![nacked.0.clone()],
        "only the nacked message comes again"
    );
}

/// A Server-Sent Events stream at a partition's leader ends when the leader is killed (the
/// connection closes); one on a follower is refused at once, naming the leader. Acks confirmed
/// before the kill hold: polled through a survivor afterwards, the new leader delivers the
/// unacked messages and never an acked one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_stream_through_a_leader_kill_keeps_its_acks() {
    let mut cluster = Cluster::start("cluster-http-stream", 3);
    let https: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http.unwrap()).collect();
    let create = br#"{"name":"feed","partitions":1}"#;
    let (status, head, reply) = http_past_elections(https[0], "POST", "/topics", create);
    assert_eq!(status, 201, "{head}\n{reply}");
    let leader = cluster.index_of(wait_leaders(https[0], "feed", 1)[0]);
    let (follower, other) = ((leader + 1) % 3, (leader + 2) % 3);
    for i in 0..10 {
        publish_to(https[follower], "feed", 0, &format!("item-{i}"));
    }

    let stream = "/topics/feed/subscriptions/readers/stream?start=earliest&ack_timeout_ms=1000";
    let (status, head, reply) = common::http_with_head(https[follower], "GET", stream, &[], b"");
    let reply = String::from_utf8_lossy(&reply);
    assert_eq!(status, 503, "{head}\n{reply}");
    assert!(reply.contains("not_leader"), "{reply}");
    assert_eq!(header(&head, "retry-after"), Some("1"), "{head}");

    let mut sse = SseReader::open(https[leader], stream);
    assert!(
        sse.read_until(Duration::from_secs(20), |s| s.events("message").len() >= 10),
        "{}",
        sse.text
    );
    let token = sse.events("consumer")[0]["consumer"]
        .as_str()
        .unwrap()
        .to_owned();
    let messages = sse.events("message");
    let ids: Vec<String> = messages
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    let (acked, unacked) = ids.split_at(6);
    let list: Vec<String> = acked.iter().map(|id| format!("\"{id}\"")).collect();
    let ack = format!(r#"{{"consumer":"{token}","ids":[{}]}}"#, list.join(","));
    let path = "/topics/feed/subscriptions/readers/ack";
    let (status, head, reply) = http_json(https[follower], "POST", path, &ack);
    assert_eq!(status, 200, "{head}\n{reply}");
    assert_eq!(reply["acked"], 6, "{reply}");
    assert_eq!(served_by(&head), vec![cluster.nodes[leader].id], "{head}");

    cluster.kill(leader);
    assert!(
        sse.read_until(Duration::from_secs(20), |s| s.ended),
        "the stream did not end: {}",
        sse.text
    );

    // Through a survivor: the new leader delivers what was not acked, never what was.
    let poll = "/topics/feed/subscriptions/readers/poll?max=100&wait_ms=1000&ack_timeout_ms=1000";
    let mut again: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let quiet_until = Instant::now() + Duration::from_secs(4);
    while again.len() < unacked.len() || Instant::now() < quiet_until {
        assert!(Instant::now() < deadline, "again {again:?}");
        let asked = Instant::now();
        let (status, head, reply) = http_json(https[other], "POST", poll, "");
        assert!(asked.elapsed() < Duration::from_secs(15), "{head}");
        if status == 503 {
            // The leader is being elected or still named: a clear reason, and when to retry.
            assert_eq!(reply["error"]["code"], "not_leader", "{head}\n{reply}");
            assert_eq!(header(&head, "retry-after"), Some("1"), "{head}");
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        assert_eq!(status, 200, "{head}\n{reply}");
        let token = reply["consumer"].as_str().unwrap().to_owned();
        let mut ids = Vec::new();
        for m in reply["messages"].as_array().unwrap() {
            let id = m["id"].as_str().unwrap().to_owned();
            assert!(
                !acked.contains(&id),
                "{id} was acked, and came again: {reply}"
            );
            ids.push(format!("\"{id}\""));
            if !again.contains(&id) {
                again.push(id);
            }
        }
        if !ids.is_empty() {
            let ack = format!(r#"{{"consumer":"{token}","ids":[{}]}}"#, ids.join(","));
            let (status, head, reply) = http_json(https[follower], "POST", path, &ack);
            assert_eq!(status, 200, "{head}\n{reply}");
        }
    }
    let mut expected = unacked.to_vec();
    expected.sort();
    again.sort();
    assert_eq!(again, expected);
}

/// Across a cut link, HTTP consumers get a clear answer rather than silence: a poll through a
/// follower cut off from the leader answers `503 not_leader` with the reason and `Retry-After`
/// within its wait (and the hop's margin); a stream at a leader cut off from its followers
/// ends with `event: error` (`not_leader`, `retry: 1000`) once it no longer serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_consumers_get_a_clear_answer_across_a_cut_link() {
    let mut cluster = Cluster::plan("cluster-http-cut", 3);
    let nodes: Vec<_> = cluster.nodes.iter().map(|n| (n.id, n.cluster)).collect();
    let mesh = Mesh::start(&nodes, free_port).await;
    for node in &mut cluster.nodes {
        node.peers = mesh.peers_of(node.id, node.cluster);
    }
    // Blocking on a thread of its own: the proxies run on the test's runtime.
    let mesh = std::sync::Arc::new(mesh);
    tokio::task::spawn_blocking(move || cut_links(cluster, &mesh))
        .await
        .unwrap();
}

fn cut_links(mut cluster: Cluster, mesh: &Mesh) {
    cluster.boot_all();
    let https: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http.unwrap()).collect();
    let create = br#"{"name":"cut","partitions":1}"#;
    let (status, head, reply) = http_past_elections(https[0], "POST", "/topics", create);
    assert_eq!(status, 201, "{head}\n{reply}");
    let leader = cluster.index_of(wait_leaders(https[0], "cut", 1)[0]);
    let follower = (leader + 1) % 3;
    for i in 0..3 {
        publish_to(https[follower], "cut", 0, &format!("cut-{i}"));
    }
    let mut sse = SseReader::open(
        https[leader],
        "/topics/cut/subscriptions/s/stream?start=earliest",
    );
    assert!(
        sse.read_until(Duration::from_secs(20), |s| s.events("message").len() >= 3),
        "{}",
        sse.text
    );

    let runtime = tokio::runtime::Handle::current();
    let ws_path = format!(
        "ws://{}/topics/cut/subscriptions/w/ws?start=earliest",
        https[leader]
    );
    let (mut ws, _) = runtime
        .block_on(tokio_tungstenite::connect_async(ws_path))
        .unwrap();
    let mut frames = Vec::new();
    let read = ws_read(&mut ws, &mut frames, |f| {
        f.iter().filter(|f| f["type"] == "message").count() >= 3
    });
    assert!(runtime.block_on(read).is_none(), "{frames:?}");

    mesh.isolate(cluster.nodes[follower].id, LinkState::Refused);
    let poll = "/topics/cut/subscriptions/p/poll?start=earliest&wait_ms=1000";
    let asked = Instant::now();
    let (status, head, reply) = http_json(https[follower], "POST", poll, "");
    let took = asked.elapsed();
    assert_eq!(status, 503, "{head}\n{reply}");
    assert_eq!(reply["error"]["code"], "not_leader", "{reply}");
    assert_eq!(header(&head, "retry-after"), Some("1"), "{head}");
    assert!(took < Duration::from_secs(12), "answered after {took:?}");
    mesh.heal();

    mesh.isolate(cluster.nodes[leader].id, LinkState::Stalled);
    assert!(
        sse.read_until(Duration::from_secs(20), |s| !s.events("error").is_empty()),
        "the stream went on: {}",
        sse.text
    );
    let error = &sse.events("error")[0]["error"];
    assert_eq!(error["code"], "not_leader", "{error}");
    assert!(sse.text.contains("retry: 1000"), "{}", sse.text);
    let close = runtime.block_on(ws_read(&mut ws, &mut frames, |_| false));
    let close = close.unwrap_or_else(|| panic!("no close frame after {frames:?}"));
    assert_eq!(u16::from(close.code), 1013, "{close:?}");
    let error = frames.iter().find(|f| f["type"] == "error").unwrap();
    assert_eq!(error["error"]["code"], "not_leader", "{frames:?}");
    mesh.heal();

    // Healed: a poll through any node reads the partition again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, head, reply) = http_json(https[follower], "POST", poll, "");
        if status == 200 && !reply["messages"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(status == 200 || status == 503, "{head}\n{reply}");
        assert!(Instant::now() < deadline, "{head}\n{reply}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

type WebSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Reads a consumer's WebSocket, its JSON text frames into `frames`, until `done` holds of them
/// (`None`) or the server closes it (its close frame), bounded: 20 s.
async fn ws_read(
    ws: &mut WebSocket,
    frames: &mut Vec<Value>,
    done: impl Fn(&[Value]) -> bool,
) -> Option<tokio_tungstenite::tungstenite::protocol::CloseFrame> {
    use futures_util::StreamExt as _;
    use tokio_tungstenite::tungstenite::Message;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done(frames) {
        let frame = tokio::time::timeout_at(deadline, ws.next()).await;
        match frame {
            Ok(Some(Ok(Message::Text(text)))) => frames.push(serde_json::from_str(&text).unwrap()),
            Ok(Some(Ok(Message::Close(close)))) => return close,
            Ok(Some(Ok(_))) => {}
            other => panic!("the socket ended without a close frame: {other:?}; {frames:?}"),
        }
    }
    None
}

/// A node holding no replica of a partition (a topic of one replica on three nodes) does not
/// hear who leads it, yet serves polls of it and takes acks for it: it asks the partition's
/// replicas in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_polls_and_acks_through_a_node_holding_no_replica() {
    let cluster = Cluster::start("cluster-http-solo", 3);
    let https: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http.unwrap()).collect();
    let ids: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();
    let create = br#"{"name":"solo","partitions":2,"replicas":1}"#;
    let (status, head, reply) = http_past_elections(https[0], "POST", "/topics", create);
    assert_eq!(status, 201, "{head}\n{reply}");
    let leaders = wait_leaders_seen(&https, "solo", 2);
    let outsider = (0..3).find(|i| !leaders.contains(&ids[*i])).unwrap();
    let mut sent = Vec::new();
    for i in 0..10u32 {
        let body = format!("solo-{i}");
        publish_to(https[outsider], "solo", i % 2, &body);
        sent.push(body);
    }

    let poll =
        "/topics/solo/subscriptions/s/poll?start=earliest&max=100&wait_ms=1000&ack_timeout_ms=1000";
    let mut received: Vec<(String, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.len() < sent.len() {
        assert!(Instant::now() < deadline, "received {received:?}");
        let (status, head, reply) = http_json(https[outsider], "POST", poll, "");
        assert_eq!(status, 200, "{head}\n{reply}");
        assert!(!served_by(&head).contains(&ids[outsider]), "{head}");
        let token = reply["consumer"].as_str().unwrap();
        let mut polled = Vec::new();
        for m in reply["messages"].as_array().unwrap() {
            let id = m["id"].as_str().unwrap().to_owned();
            received.push((id.clone(), m["body"].as_str().unwrap().to_owned()));
            polled.push(format!("\"{id}\""));
        }
        if polled.is_empty() {
            continue;
        }
        // Acked through the same node, which knows no leader of either partition.
        let ack = format!(r#"{{"consumer":"{token}","ids":[{}]}}"#, polled.join(","));
        let path = "/topics/solo/subscriptions/s/ack";
        let (status, head, reply) = http_json(https[outsider], "POST", path, &ack);
        assert_eq!(status, 200, "{head}\n{reply}");
        assert_eq!(reply["acked"], polled.len(), "{reply}");
    }
    let mut bodies: Vec<&str> = received.iter().map(|r| r.1.as_str()).collect();
    bodies.sort_unstable();
    let mut expected: Vec<&str> = sent.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(bodies, expected, "each message once");

    // Past the ack timeout nothing comes again.
    let quiet_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < quiet_until {
        let (status, head, reply) = http_json(https[outsider], "POST", poll, "");
        assert_eq!(status, 200, "{head}\n{reply}");
        assert_eq!(reply["messages"], serde_json::json!([]), "{reply}");
    }
}
