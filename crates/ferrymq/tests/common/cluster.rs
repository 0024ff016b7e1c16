//! Real `ferrymq serve` nodes of one cluster on loopback, for the cluster's tests: ports chosen
//! up front and kept across restarts, each node's own `--peers` list (so that a test can route
//! a node's links through a proxy), kill -9 and SIGTERM, and each node's partition logs read
//! back by message id over HTTP (only a partition's leader delivers it; every replica answers a
//! look-up by id).

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ferrymq_client::{Client, ClientConfig, TopicConfig};

use super::{temp_dir, Served, BIN};

/// A free loopback port. Nodes must know each other's addresses before they start, so the
/// ports are chosen up front and kept across restarts. They come from below the kernel's
/// ephemeral range (32768 and up), where the listeners other tests bind to port 0 never land,
/// and a counter keeps this process's choices apart.
pub fn free_port() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = 20_000 + (std::process::id() * 97) % 10_000;
    loop {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 2_700;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        if TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
}

pub struct Node {
    pub id: u64,
    pub dir: PathBuf,
    /// Where clients reach it.
    pub tcp: SocketAddr,
    /// Where it listens for its peers.
    pub cluster: SocketAddr,
    /// Its `--peers`: every node, itself at `cluster`, the others where it reaches them.
    pub peers: String,
    /// The HTTP listener of the running process.
    pub http: Option<SocketAddr>,
    /// More flags for its next start.
    pub extra: Vec<String>,
    pub process: Option<Served>,
}

pub struct Cluster {
    pub nodes: Vec<Node>,
}

impl Cluster {
    /// `count` nodes, each reaching the others directly, started and serving.
    pub fn start(name: &str, count: u64) -> Cluster {
        let mut cluster = Cluster::plan(name, count);
        let peers = cluster.direct_peers();
        for node in &mut cluster.nodes {
            node.peers = peers.clone();
        }
        cluster.boot_all();
        cluster
    }

    /// `count` nodes with their addresses and data directories, none started; `peers` empty.
    pub fn plan(name: &str, count: u64) -> Cluster {
        let base = temp_dir(name);
        let nodes = (1..=count)
            .map(|id| Node {
                id,
                dir: base.join(format!("node{id}")),
                tcp: free_port(),
                cluster: free_port(),
                peers: String::new(),
                http: None,
                extra: Vec::new(),
                process: None,
            })
            .collect();
        Cluster { nodes }
    }

    /// The `--peers` of a cluster whose nodes reach each other directly.
    pub fn direct_peers(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("{}={}", n.id, n.cluster))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts every node, then waits (bounded) until each serves its clients.
    pub fn boot_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.boot(i);
        }
        for i in 0..self.nodes.len() {
            self.wait_serving(i);
        }
    }

    /// Waits (bounded) until node `index` serves its clients, and notes its HTTP address.
    pub fn wait_serving(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        let process = node.process.as_mut().unwrap();
        process.tcp_addr();
        node.http = Some(process.http_addr());
    }

    /// Starts node `index` (its log lines are collected; see [`Cluster::warnings`]).
    pub fn boot(&mut self, index: usize) {
        let node = &self.nodes[index];
        let (id, tcp, cluster) = (
            node.id.to_string(),
            node.tcp.to_string(),
            node.cluster.to_string(),
        );
        // FERRYMQ_CLUSTER_LOG: the nodes' log filter, say `info,openraft=info` to follow each
        // election; FERRYMQ_CLUSTER_BIN: another `ferrymq` binary to run (a release build);
        // FERRYMQ_CLUSTER_ELECTION_MS: their --election-timeout-ms (300 here, 500 by default).
        let election =
            std::env::var("FERRYMQ_CLUSTER_ELECTION_MS").unwrap_or_else(|_| "300".into());
        let log =
            std::env::var("FERRYMQ_CLUSTER_LOG").unwrap_or_else(|_| "info,openraft=warn".into());
        let bin = std::env::var("FERRYMQ_CLUSTER_BIN").unwrap_or_else(|_| BIN.to_owned());
        let mut args = vec![
            "--data-dir",
            node.dir.to_str().unwrap(),
            "--tcp-addr",
            &tcp,
            "--node-id",
            &id,
            "--cluster-addr",
            &cluster,
            "--peers",
            &node.peers,
            "--election-timeout-ms",
            &election,
            "--log",
            &log,
        ];
        args.extend(node.extra.iter().map(String::as_str));
        let served = Served::start_bin(&bin, &args, &[]);
        self.nodes[index].process = Some(served);
    }

    /// Every node's client address, as a client is given them.
    pub fn addrs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.tcp.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn index_of(&self, id: u64) -> usize {
        self.nodes.iter().position(|n| n.id == id).unwrap()
    }

    /// What the nodes logged at warn and above, for a failure's message.
    pub fn warnings(&mut self) -> String {
        let mut out = String::new();
        for node in &mut self.nodes {
            if let Some(process) = node.process.as_mut() {
                for line in process.collect() {
                    if line.contains("WARN") || line.contains("ERROR") {
                        out.push_str(&format!("node {}: {line}\n", node.id));
                    }
                }
            }
        }
        out
    }

    /// kill -9 (Served's drop is kill -9 and a wait).
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].process = None;
        self.nodes[index].http = None;
    }

    /// SIGTERM, and a bounded wait for a clean exit.
    pub fn stop(&mut self, index: usize) {
        self.nodes[index].http = None;
        let mut process = self.nodes[index].process.take().unwrap();
        process.signal("TERM");
        let status = process.wait_exit_within(Duration::from_secs(30));
        assert!(
            status.success(),
            "node {} exited with {status} after SIGTERM; it logged:\n{}",
            self.nodes[index].id,
            process.collect().join("\n")
        );
    }
}

/// A client of the cluster: generous timeouts, for a cluster electing leaders.
pub fn config(addrs: &str) -> ClientConfig {
    let mut config = ClientConfig::new(addrs.to_owned());
    config.connect_timeout = Duration::from_secs(5);
    config.request_timeout = Some(Duration::from_secs(10));
    config
}

/// Creates the replicated topic `name` through the metadata leader, retrying (bounded) while
/// the first leader is elected.
pub async fn create_topic(addrs: &str, name: &str, partitions: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let config_of_topic = TopicConfig {
        partitions,
        ..TopicConfig::default()
    };
    loop {
        let created = match Client::connect_leader(config(addrs), None, 0).await {
            Ok(admin) => {
                let created = admin
                    .create_topic(name, config_of_topic.clone(), true)
                    .await;
                let _ = admin.close().await;
                created
            }
            Err(e) => Err(e),
        };
        match created {
            Ok(()) => return,
            Err(e) if Instant::now() < deadline => eprintln!("creating {name}: {e}; retried"),
            Err(e) => panic!("creating {name}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every body `node` holds in `partition` of `topic`, in offset order, read message by message
/// over HTTP; empty when the node is down.
pub fn partition_log(node: &Node, topic: &str, partition: u32) -> Vec<String> {
    let Some(http) = node.http else {
        return Vec::new();
    };
    let mut bodies = Vec::new();
    for offset in 0.. {
        let path = format!("/topics/{topic}/messages/{partition}-{offset}/content");
        let (status, body) = super::http(http, "GET", &path, &[], b"");
        if status == 404 {
            break;
        }
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        bodies.push(json["body"].as_str().unwrap().to_owned());
    }
    bodies
}

/// Each node's log of each partition of `topic`: `logs[node][partition]`, the bodies in offset
/// order.
pub fn partition_logs(nodes: &[Node], topic: &str, partitions: u32) -> Vec<Vec<Vec<String>>> {
    nodes
        .iter()
        .map(|node| {
            (0..partitions)
                .map(|p| partition_log(node, topic, p))
                .collect()
        })
        .collect()
}

/// Connects to the leader of `topic`/0 and attaches to its subscription `name` from the
/// earliest message, retrying (bounded) while a leader is elected.
pub async fn attach(
    addrs: &str,
    topic: &str,
    name: &str,
) -> (Client, ferrymq_client::Subscription) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = async {
            let client = Client::connect_leader(config(addrs), Some(topic), 0).await?;
            let subscription = client
                .subscribe(
                    ferrymq_client::SubscribeOptions::new(topic)
                        .subscription(name)
                        .start(ferrymq_client::protocol::StartPosition::Earliest),
                )
                .await?;
            Ok::<_, ferrymq_client::Error>((client, subscription))
        };
        match attempt.await {
            Ok(attached) => return attached,
            Err(e) => {
                assert!(Instant::now() < deadline, "no consumer attached: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Publishes bodies `m{first}..m{first + count}` to `topic`, one publish (one log entry) each,
/// through the leader of its partition 0 (the cluster passes other partitions' parts on), each
/// with its dedup id `d{i}`, so that a publish resent after a lost answer is stored once.
pub async fn publish_numbered(addrs: &str, topic: &str, first: usize, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut client: Option<Client> = None;
    let mut i = first;
    while i < first + count {
        assert!(Instant::now() < deadline, "publishing m{i} took too long");
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            client = Client::connect_leader(config(addrs), Some(topic), 0)
                .await
                .ok();
            if client.is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        }
        let message = ferrymq_client::Message::new(format!("m{i}").into_bytes())
            .with_dedup_id(format!("d{i}"));
        match client.as_ref().unwrap().publish(topic, message).await {
            Ok(_) => i += 1,
            Err(e) => {
                eprintln!("publish m{i}: {e}; sent again with its dedup id");
                client = None;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    if let Some(c) = client {
        let _ = c.close().await;
    }
}
