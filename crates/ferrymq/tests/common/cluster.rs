//! Real `ferrymq serve` nodes of one cluster on loopback, for the cluster's tests: ports chosen
//! up front and kept across restarts, each node's own `--peers` list (so that a test can route
//! a node's links through a proxy), kill -9 and SIGTERM, and each node's partition logs read
//! back with `ferrymq sub`.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
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
        for node in &mut self.nodes {
            node.process.as_mut().unwrap().tcp_addr();
        }
    }

    /// Starts node `index` (its log lines are collected; see [`Cluster::warnings`]).
    pub fn boot(&mut self, index: usize) {
        let node = &self.nodes[index];
        let (id, tcp, cluster) = (
            node.id.to_string(),
            node.tcp.to_string(),
            node.cluster.to_string(),
        );
        let served = Served::start(
            &[
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
                "300",
                "--log",
                "info,openraft=warn",
            ],
            &[],
        );
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
    }

    /// SIGTERM, and a bounded wait for a clean exit.
    pub fn stop(&mut self, index: usize) {
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

/// `ferrymq sub` reading `partition` of `topic` on `node` from the start, through a private
/// subscription, until nothing arrives for `idle`.
fn spawn_reader(node: &Node, topic: &str, partition: Option<u32>, idle: &str) -> Child {
    let mut command = Command::new(BIN);
    command
        .args(["sub", topic, "--addr", &node.tcp.to_string()])
        .args(["--from", "earliest", "--timeout", idle])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(partition) = partition {
        command.args(["--partitions", &partition.to_string()]);
    }
    command.spawn().unwrap()
}

fn lines_of(child: Child) -> Vec<String> {
    let output = child.wait_with_output().unwrap();
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every body `node` holds in `topic` (every partition), through the durable subscription
/// `subscription`, in offset order within each partition.
pub fn bodies_on(node: &Node, topic: &str, subscription: &str) -> Vec<String> {
    let output = Command::new(BIN)
        .args(["sub", topic, "--addr", &node.tcp.to_string()])
        .args(["--from", "earliest", "--subscription", subscription])
        .args(["--timeout", "3s"])
        .output()
        .unwrap();
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Each node's log of each partition of `topic`: `logs[node][partition]`, the bodies in offset
/// order. Every reader runs at once, each a private subscription from the start.
pub fn partition_logs(nodes: &[Node], topic: &str, partitions: u32) -> Vec<Vec<Vec<String>>> {
    let readers: Vec<Vec<Child>> = nodes
        .iter()
        .map(|node| {
            (0..partitions)
                .map(|p| spawn_reader(node, topic, Some(p), "2s"))
                .collect()
        })
        .collect();
    readers
        .into_iter()
        .map(|children| children.into_iter().map(lines_of).collect())
        .collect()
}
