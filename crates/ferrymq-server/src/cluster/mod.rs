//! Cluster mode: this node's Raft groups (`ferrymq-cluster`) wired to its broker.
//!
//! The broker knows nothing of the cluster; it offers seams (split a publish by partition, store
//! a committed batch exactly, tell a partition's next offset) and this module drives them:
//!
//! - **Metadata** (group 0, on every node) holds the members and the replicated topics with
//!   their configuration and placement. The [`controller`] follows it on every node: it creates
//!   each topic in the local broker and starts the groups of the partitions placed here.
//! - **A replicated publish** is split by partition; each part is proposed to its partition's
//!   group on its leader and acknowledged once committed (stored by a majority of the replicas,
//!   each after its fsync) and applied. Every replica applies the batch to its broker's log
//!   ([`log::BrokerLog`]), so every replica gives it the same offsets and consumers read it as
//!   any other message.
//! - **A node that does not lead** what a request needs answers `not_leader`, naming the leader
//!   and its client address when known.

mod controller;
mod fold;
mod forward;
mod identity;
mod log;
mod membership;
mod requests;
mod serving;
mod status;
mod users;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferrymq_broker::Broker;
use ferrymq_cluster::durable::LogDb;
use ferrymq_cluster::storage::{GroupLog, GroupStorage};
use ferrymq_cluster::tcp::{Directory, TcpConfig, TcpServer, TcpTransport};
use ferrymq_cluster::{ClusterNode, GroupId, NodeId};

pub use ferrymq_cluster::GroupTiming;
pub use forward::{HttpAnswerer, PeerStatus, StatusSource};
pub use requests::{ClusterView, PartitionView};
pub use status::{Election, GroupState, LAG_ENTRIES_MAX};

/// How this node takes part in a cluster: `ferrymq serve --node-id --cluster-addr --peers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// Only nodes with the same id talk to each other; a data directory remembers its own.
    pub cluster_id: String,
    pub node_id: NodeId,
    /// Where this node listens for its peers.
    pub cluster_addr: SocketAddr,
    /// Every node of the cluster, this one included, by id: where each listens for peers, as
    /// `HOST:PORT` with an IP address or a host name (looked up on every connection attempt,
    /// so that a name follows its node to a new address).
    pub peers: BTreeMap<NodeId, String>,
    /// Where clients reach this node, told to its peers so that `not_leader` can name it.
    pub client_addr: String,
    pub timing: GroupTiming,
    /// How long a replicated write may wait for its commit before the client is told its
    /// outcome is unknown.
    pub write_timeout: Duration,
    /// Mutual TLS between the nodes, when set.
    pub tls: Option<crate::tls::PeerTlsFiles>,
    /// This node joins a running cluster (`ferrymq cluster add-node` admits it): it never
    /// proposes a first membership of its own.
    pub join: bool,
}

impl ClusterSettings {
    /// Checks what a node can check alone: every peer address is `HOST:PORT`, and this node is
    /// among its peers at its own address (the same socket address when given as an IP
    /// address; the same port when given as a host name, which may name any of its interfaces).
    pub fn validate(&self) -> Result<(), String> {
        if self.cluster_id.is_empty() || self.cluster_id.len() > 64 {
            return Err("the cluster id is 1 to 64 characters".into());
        }
        for (id, addr) in &self.peers {
            split_host_port(addr).map_err(|e| format!("--peers: node {id}: {e}"))?;
        }
        let Some(addr) = self.peers.get(&self.node_id) else {
            return Err(format!(
                "--peers does not list this node ({}): list every node, this one included, \
                 as ID=HOST:PORT",
                self.node_id
            ));
        };
        let mismatch = match addr.parse::<SocketAddr>() {
            Ok(socket) => socket != self.cluster_addr,
            Err(_) => split_host_port(addr)?.1 != self.cluster_addr.port(),
        };
        if mismatch {
            return Err(format!(
                "--peers gives node {} the address {addr}, but --cluster-addr is {}",
                self.node_id, self.cluster_addr
            ));
        }
        Ok(())
    }

    /// The replicas a topic gets when it asks for none: 3 when there are at least 3 nodes.
    pub fn replicas_default(&self) -> u32 {
        (self.peers.len() as u32).min(3)
    }
}

/// This node's part of the cluster. Dropping it stops the node's groups and its peer listener.
pub struct Cluster {
    settings: ClusterSettings,
    broker: Broker,
    node: Arc<ClusterNode<TcpTransport>>,
    db: LogDb,
    directory: Directory,
    /// The topic of every partition group this node has followed; kept after the topic's
    /// deletion until its group is stopped here.
    group_topics: parking_lot::Mutex<BTreeMap<GroupId, String>>,
    /// The groups whose replica here has caught up since it started and stayed within
    /// [`LAG_ENTRIES_MAX`] of its leader's commit index since (see `GroupState::caught_up`).
    caught_up: parking_lot::Mutex<BTreeSet<GroupId>>,
    /// Deduplication ids of publishes being replicated from here.
    dedup_pending: requests::PendingIds,
    /// Publishes to each partition led here, folded into entries.
    folds: fold::Folds,
    /// The leader changes this node saw (see [`Cluster::elections`]).
    elections: parking_lot::Mutex<status::ElectionLog>,
    /// What this node answers a peer asking for its status (see [`Cluster::peer_statuses`]).
    status_source: std::sync::OnceLock<forward::StatusSource>,
    http_answerer: std::sync::OnceLock<forward::HttpAnswerer>,
    _server: TcpServer,
    _tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node_id", &self.settings.node_id)
            .field("cluster_id", &self.settings.cluster_id)
            .finish()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for task in &self._tasks {
            task.abort();
        }
    }
}

impl Cluster {
    /// Joins the cluster: opens the node's Raft log in `data_dir/cluster`, listens for peers,
    /// starts the metadata group (proposing the first membership, every peer, if the cluster is
    /// new) and the controller that follows it.
    // The steps in the order a node joins: each needs the one before it.
    pub async fn start(
        settings: ClusterSettings,
        broker: Broker,
        data_dir: &Path,
    ) -> Result<Arc<Cluster>, String> {
        settings.validate()?;
        let dir = data_dir.join("cluster");
        identity::claim(&dir, &settings)?;
        let db = LogDb::open(dir.join("raft.redb")).map_err(|e| e.to_string())?;
        let mut tcp = TcpConfig::new(settings.cluster_id.clone(), settings.node_id);
        tcp.client_addr = settings.client_addr.clone();
        if let Some(files) = &settings.tls {
            let (server, client) = crate::tls::load_peer(files)
                .map_err(|e| format!("cannot use the cluster's TLS files: {e}"))?;
            tcp.tls = Some(ferrymq_cluster::tcp::PeerTls { server, client });
        }
        let directory = tcp.directory.clone();
        directory.learn(settings.node_id, &settings.client_addr);
        let others: BTreeMap<NodeId, String> = settings
            .peers
            .iter()
            .filter(|(id, _)| **id != settings.node_id)
            .map(|(id, addr)| (*id, addr.clone()))
            .collect();
        let transport = TcpTransport::new(tcp.clone(), others);
        let node = Arc::new(ClusterNode::new(transport, settings.timing));
        let server = TcpServer::bind(settings.cluster_addr, &tcp, node.router())
            .await
            .map_err(|e| format!("listening for peers on {}: {e}", settings.cluster_addr))?;
        let metadata = GroupStorage::metadata_on(GroupLog::Durable(db.group(GroupId::METADATA)))
            .map_err(|e| format!("the metadata's snapshot in {}: {e}", dir.display()))?;
        let fresh = metadata.log.is_fresh();
        node.start_group(GroupId::METADATA, metadata)
            .await
            .map_err(|e| e.to_string())?;
        if fresh && !settings.join {
            let voters: BTreeSet<NodeId> = settings.peers.keys().copied().collect();
            // Every node of a new cluster proposes the same first membership; whichever of them
            // is elected first commits it, and the others' proposals are the same entry.
            if let Err(e) = node.initialize(GroupId::METADATA, &voters).await {
                tracing::debug!(error = %e, "metadata membership already proposed");
            }
        }
        let heartbeats = node.spawn_heartbeats();
        let cluster = Arc::new_cyclic(|weak| {
            let controller = tokio::spawn(controller::run(weak.clone()));
            let gate = tokio::spawn(serving::run_gate(weak.clone()));
            node.router()
                .set_forward_handler(Arc::new(forward::Handler(weak.clone())));
            broker.set_cursor_replicator(Arc::new(serving::ClusterReplicator {
                cluster: weak.clone(),
                runtime: tokio::runtime::Handle::current(),
            }));
            broker
                .auth()
                .set_user_replicator(Arc::new(users::ClusterUsers {
                    cluster: weak.clone(),
                    runtime: tokio::runtime::Handle::current(),
                }));
            Cluster {
                settings,
                broker,
                node,
                db,
                directory,
                group_topics: parking_lot::Mutex::default(),
                caught_up: parking_lot::Mutex::default(),
                dedup_pending: Default::default(),
                folds: Default::default(),
                elections: Default::default(),
                status_source: Default::default(),
                http_answerer: Default::default(),
                _server: server,
                _tasks: vec![heartbeats, controller, gate],
            }
        });
        // Before clients are served: the replicated partitions this node held are closed until
        // the gate finds it leading them.
        cluster.update_gates();
        tracing::info!(
            node = cluster.settings.node_id,
            cluster = %cluster.settings.cluster_id,
            peers = cluster.settings.peers.len(),
            "cluster node started"
        );
        Ok(cluster)
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.settings.node_id
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    /// Stops every group (their logs stay on disk for the next start).
    pub async fn shutdown(&self) {
        for task in &self._tasks {
            task.abort();
        }
        self.node.shutdown().await;
    }
}

/// `HOST:PORT` (`[V6]:PORT` for an IPv6 address) split into its host and port.
pub fn split_host_port(addr: &str) -> Result<(&str, u16), String> {
    let bad = || format!("'{addr}' is not HOST:PORT");
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']').ok_or_else(bad)?,
        None if host.contains(':') => return Err(bad()),
        None => host,
    };
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if !name_ok || port == 0 {
        return Err(bad());
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(node_id: NodeId, cluster_addr: &str, peers: &[(NodeId, &str)]) -> ClusterSettings {
        ClusterSettings {
            cluster_id: "ferrymq".into(),
            node_id,
            cluster_addr: cluster_addr.parse().unwrap(),
            peers: peers.iter().map(|(id, a)| (*id, a.to_string())).collect(),
            client_addr: "127.0.0.1:7070".into(),
            timing: GroupTiming::default(),
            write_timeout: Duration::from_secs(5),
            tls: None,
            join: false,
        }
    }

    #[test]
    fn peers_may_be_host_names_and_this_node_matches_by_port() {
        let named = [(1, "node1:7090"), (2, "node2:7090"), (3, "10.0.0.3:7090")];
        assert_eq!(settings(1, "0.0.0.0:7090", &named).validate(), Ok(()));
        let error = settings(1, "0.0.0.0:7091", &named).validate().unwrap_err();
        assert!(
            error.contains("node1:7090, but --cluster-addr is 0.0.0.0:7091"),
            "{error}"
        );
        // An IP address must be this node's listener exactly.
        assert_eq!(settings(3, "10.0.0.3:7090", &named).validate(), Ok(()));
        assert!(settings(3, "0.0.0.0:7090", &named).validate().is_err());
    }

    #[test]
    fn a_peer_that_is_not_host_port_is_refused_naming_it() {
        for bad in [
            "node2",
            "node2:",
            "node2:port",
            ":7090",
            "no de:7090",
            "::1:7090",
            "n:0",
        ] {
            let peers = [(1, "127.0.0.1:7090"), (2, bad)];
            let error = settings(1, "127.0.0.1:7090", &peers)
                .validate()
                .unwrap_err();
            assert!(
                error.contains(&format!("node 2: '{bad}' is not HOST:PORT")),
                "{error}"
            );
        }
        assert_eq!(split_host_port("[::1]:7090"), Ok(("::1", 7090)));
        assert_eq!(
            split_host_port("ferrymq-2.internal:7090"),
            Ok(("ferrymq-2.internal", 7090))
        );
    }
}
