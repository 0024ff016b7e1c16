//! Changing a running cluster's members with the CLI, on real nodes: a fourth node started with
//! `--join` is admitted by `ferrymq cluster add-node`, then `remove-node` takes a node out,
//! its replicas moving to the new node (which catches up before it votes) with nothing lost,
//! and the groups go on without the removed node.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{partition_logs, Cluster};
use common::BIN;

const TOPIC: &str = "ledger";

fn cluster_page(cluster: &Cluster, index: usize) -> Option<serde_json::Value> {
    let http = cluster.nodes[index].http?;
    let (status, body) = common::http(http, "GET", "/cluster", &[], b"");
    (status == 200)
        .then(|| serde_json::from_slice(&body).ok())
        .flatten()
}

fn readyz(cluster: &Cluster, index: usize) -> (u16, String) {
    let (status, body) = common::http(
        cluster.nodes[index].http.unwrap(),
        "GET",
        "/readyz",
        &[],
        b"",
    );
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Waits (bounded) until node `index`'s `/readyz` answers `status` with `text` in its body.
fn wait_readyz(cluster: &Cluster, index: usize, status: u16, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (got, body) = readyz(cluster, index);
        if got == status && body.contains(text) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {}: /readyz {got} {body}, not {status} with {text:?}",
            cluster.nodes[index].id
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `ferrymq cluster ARGS` against node `index`'s HTTP API: its exit status and output.
fn cli(cluster: &Cluster, index: usize, args: &[&str]) -> (bool, String) {
    let http = cluster.nodes[index].http.unwrap().to_string();
    let output = Command::new(BIN)
        .arg("cluster")
        .args(args)
        .args(["--http-addr", &http, "--wait-secs", "60"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Every body of `TOPIC` held by each of `nodes`, all partitions, sorted.
fn held(cluster: &Cluster, nodes: &[usize]) -> Vec<Vec<String>> {
    let chosen: Vec<_> = nodes.iter().map(|&i| &cluster.nodes[i]).collect();
    chosen
        .iter()
        .map(|node| {
            let logs = partition_logs(std::slice::from_ref(*node), TOPIC, 2);
            let mut all: Vec<String> = logs[0].concat();
            all.sort();
            all
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_and_another_leaves_with_its_replicas_moved_and_nothing_lost() {
    let mut cluster = Cluster::plan("cluster-membership", 4);
    let founders = cluster.nodes[..3]
        .iter()
        .map(|n| format!("{}={}", n.id, n.cluster))
        .collect::<Vec<_>>()
        .join(",");
    let everyone = cluster.direct_peers();
    // Snapshots every 16 entries: the new node catches up from a snapshot, not the whole log.
    let compact = ["--snapshot-entries".to_owned(), "16".to_owned()];
    for node in &mut cluster.nodes[..3] {
        node.peers = founders.clone();
        node.extra = compact.to_vec();
    }
    cluster.nodes[3].peers = everyone;
    cluster.nodes[3].extra = [&compact[..], &["--join".to_owned()]].concat();
    for i in 0..3 {
        cluster.boot(i);
    }
    for i in 0..3 {
        cluster.wait_serving(i);
    }
    let founders_addrs = cluster.nodes[..3]
        .iter()
        .map(|n| n.tcp.to_string())
        .collect::<Vec<_>>()
        .join(",");
    common::cluster::create_topic(&founders_addrs, TOPIC, 2).await;
    common::cluster::publish_numbered(&founders_addrs, TOPIC, 0, 30).await;

    // Node 4 starts, waits to be admitted, and is.
    cluster.boot(3);
    cluster.wait_serving(3);
    let (status, body) = readyz(&cluster, 3);
    assert_eq!(
        status, 503,
        "a node waiting to be admitted is not ready: {body}"
    );
    let addr4 = cluster.nodes[3].cluster.to_string();
    let (ok, out) = cli(&cluster, 0, &["add-node", "4", "--cluster-addr", &addr4]);
    assert!(ok, "add-node failed:\n{out}");
    assert!(out.contains("done: node 4 votes"), "{out}");
    let page = cluster_page(&cluster, 0).unwrap();
    let ids: Vec<u64> = page["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3, 4], "{page:#}");
    wait_readyz(&cluster, 3, 200, "");

    // Node 3 leaves: its replicas move to node 4, the only member without any.
    let (ok, out) = cli(&cluster, 0, &["remove-node", "3"]);
    assert!(ok, "remove-node failed:\n{out}");
    assert!(out.contains("done: node 3 holds no replica"), "{out}");
    let page = cluster_page(&cluster, 0).unwrap();
    for p in page["partitions"].as_array().unwrap() {
        let mut voters: Vec<u64> = serde_json::from_value(p["voters"].clone()).unwrap();
        voters.sort_unstable();
        assert_eq!(voters, [1, 2, 4], "{p:#}");
    }
    assert_eq!(
        page["metadata_voters"].as_array().map(Vec::len),
        Some(3),
        "{page:#}"
    );

    // Node 3 knows it was removed and says so to its load balancer.
    wait_readyz(&cluster, 2, 503, "node 3 was removed");

    // Without node 3 the cluster goes on, and node 4 holds everything.
    let joined_log = cluster.nodes[3]
        .process
        .as_mut()
        .unwrap()
        .collect()
        .to_vec();
    assert!(
        joined_log
            .iter()
            .any(|l| l.contains("installed a snapshot")),
        "node 4 caught up without a snapshot:\n{}",
        joined_log.join("\n")
    );
    cluster.kill(2);
    let members: String = [0, 1, 3]
        .iter()
        .map(|&i| cluster.nodes[i].tcp.to_string())
        .collect::<Vec<_>>()
        .join(",");
    common::cluster::publish_numbered(&members, TOPIC, 30, 20).await;
    let want: Vec<String> = {
        let mut all: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
        all.sort();
        all
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = held(&cluster, &[0, 1, 3]);
        if logs.iter().all(|l| *l == want) {
            break;
        }
        assert!(Instant::now() < deadline, "nodes 1, 2, 4 hold {logs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // What cannot be done is refused, naming why.
    let (ok, out) = cli(&cluster, 0, &["remove-node", "9"]);
    assert!(!ok && out.contains("not a member"), "{out}");
    let (ok, out) = cli(&cluster, 0, &["add-node", "5", "--cluster-addr", "nowhere"]);
    assert!(!ok && out.contains("cluster_addr"), "{out}");
}
