//! Publishes to one partition folded into shared Raft entries, on three real nodes: hundreds of
//! publishes in flight at once take fewer entries than publishes, and each is acknowledged
//! with the offset its own message got, on every replica.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::{config, Cluster};
use ferrymq_client::{Client, Message};

const TOPIC: &str = "folded";
const PUBLISHES: usize = 400;

/// The raft log's last index of `TOPIC`'s group on node `index`.
fn last_index(cluster: &Cluster, index: usize) -> Option<u64> {
    let (status, body) = common::http(cluster.nodes[index].http?, "GET", "/node", &[], b"");
    if status != 200 {
        return None;
    }
    let node: serde_json::Value = serde_json::from_slice(&body).ok()?;
    node["cluster"]["groups"]
        .as_array()?
        .iter()
        .find(|g| g["topic"] == TOPIC)?["last_log_index"]
        .as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_in_flight_share_entries_and_each_gets_its_own_offset() {
    let mut cluster = Cluster::start("cluster-fold", 3);
    let addrs = cluster.addrs();
    common::cluster::create_topic(&addrs, TOPIC, 1).await;
    let client = Arc::new(
        Client::connect_leader(config(&addrs), Some(TOPIC), 0)
            .await
            .unwrap(),
    );
    let leader = cluster.index_of(client.cluster_info().await.unwrap().node_id);
    let before = last_index(&cluster, leader).unwrap_or(0);

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..PUBLISHES {
        let client = client.clone();
        tasks.spawn(async move {
            let body = format!("f{i}");
            let id = client
                .publish(TOPIC, Message::new(body.clone().into_bytes()))
                .await
                .unwrap_or_else(|e| panic!("publish {body}: {e}"));
            (id.offset, body)
        });
    }
    let mut acked = Vec::new();
    while let Some(done) = tasks.join_next().await {
        acked.push(done.unwrap());
    }
    acked.sort();
    let offsets: Vec<u64> = acked.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (0..PUBLISHES as u64).collect::<Vec<_>>());

    let entries = last_index(&cluster, leader).unwrap() - before;
    eprintln!("{PUBLISHES} publishes in flight took {entries} Raft entries");
    assert!(
        (entries as usize) < PUBLISHES,
        "{PUBLISHES} publishes took {entries} entries: none shared one"
    );

    // Every replica holds each body at the offset its publish was acknowledged with.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = common::cluster::partition_logs(&cluster.nodes, TOPIC, 1);
        let want: Vec<String> = acked.iter().map(|(_, b)| b.clone()).collect();
        if logs.iter().all(|node| node[0] == want) {
            break;
        }
        let warnings = cluster.warnings();
        assert!(Instant::now() < deadline, "replicas differ\n{warnings}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
