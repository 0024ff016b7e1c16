//! Three real `ferrymq serve` nodes whose peer connections are mutual TLS
//! (`--cluster-tls-cert`, `--cluster-tls-key`, `--cluster-tls-ca`): they elect leaders and
//! replicate over it, and a node whose certificate another authority signed is refused by its
//! peers, naming TLS, while the others go on. Certificates are made by the test with rcgen.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::authority::Authority;
use common::cluster::{partition_logs, Cluster};
use ferrymq_client::{Client, Message};

/// The flags of node `node`'s certificate (naming 127.0.0.1, where every node listens) and key,
/// signed by `authority` and written to `dir`.
fn node_flags(authority: &Authority, dir: &Path, node: u64) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let (cert, key) = authority.node("127.0.0.1", &format!("node {node}"));
    let write = |name: &str, text: &str| -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let files = [
        ("--cluster-tls-cert", write("node.pem", &cert)),
        ("--cluster-tls-key", write("node-key.pem", &key)),
        ("--cluster-tls-ca", write("ca.pem", &authority.pem)),
    ];
    files
        .into_iter()
        .flat_map(|(flag, path)| [flag.to_owned(), path.display().to_string()])
        .collect()
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_replicate_over_mutual_tls_and_refuse_a_stranger() {
    let authority = Authority::new("cluster ca");
    let mut cluster = Cluster::plan("cluster-tls", 3);
    let peers = cluster.direct_peers();
    for node in &mut cluster.nodes {
        node.peers = peers.clone();
        node.extra = node_flags(&authority, &node.dir.join("tls"), node.id);
    }
    cluster.boot_all();
    let addrs = cluster.addrs();
    common::cluster::create_topic(&addrs, "orders", 1).await;

    let client = Client::connect_leader(common::cluster::config(&addrs), Some("orders"), 0)
        .await
        .unwrap();
    let sent: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    for body in &sent {
        client
            .publish("orders", Message::new(body.as_bytes().to_vec()))
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = partition_logs(&cluster.nodes, "orders", 1);
        if logs.iter().all(|node| node[0] == sent) {
            break;
        }
        let warnings = cluster.warnings();
        assert!(Instant::now() < deadline, "{logs:?}\n{warnings}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = client.close().await;

    // Node 3 comes back with a certificate of another authority: its peers refuse it (their
    // TLS handshake fails), it says why, and the two others still take publishes.
    let stranger = Authority::new("another ca");
    cluster.stop(2);
    cluster.nodes[2].extra = node_flags(&stranger, &cluster.nodes[2].dir.join("tls2"), 3);
    cluster.boot(2);
    let line = cluster.nodes[2]
        .process
        .as_mut()
        .unwrap()
        .wait_for_within("TLS with", Duration::from_secs(30));
    assert!(line.contains("refused"), "{line}");
    let two = format!("{},{}", cluster.nodes[0].tcp, cluster.nodes[1].tcp);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let published =
            match Client::connect_leader(common::cluster::config(&two), Some("orders"), 0).await {
                Ok(client) => client
                    .publish("orders", Message::new(b"after".to_vec()))
                    .await
                    .map(|_| ()),
                Err(e) => Err(e),
            };
        match published {
            Ok(()) => break,
            Err(e) => assert!(Instant::now() < deadline, "the majority stopped: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
