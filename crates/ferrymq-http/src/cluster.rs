//! In cluster mode, the requests that go through the cluster rather than straight to this
//! node's broker: publishes to replicated topics (to each partition's leader, wherever it runs)
//! and topics' creation and deletion (through the metadata group's leader). The server gives
//! the HTTP layer a [`ClusterRoutes`]; without one (a node running alone) every route uses the
//! broker as before.
//!
//! A response served through the cluster names the node or nodes that served it in the
//! `FerryMQ-Node` header, so that a caller sees where its request went and what a hop cost.
//!
//! `GET /cluster` is the cluster as the node serving it sees it: every node with its health and
//! resources (asked of each over the peers' connection), each replicated partition with its
//! leader, replicas and followers' lag, and the leader changes this node saw.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use axum::extract::State;
use ferrymq_broker::{BrokerError, PublishReceipt};
use ferrymq_protocol::{RecordBatch, TopicConfig};
use http::{HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::Json;
use crate::node::{FollowerFacts, GroupFacts};
use crate::{ApiError, ApiResult, AppState};

/// The response header naming the nodes that served a request routed through the cluster.
pub const NODE_HEADER: &str = "ferrymq-node";

/// Each other node's [`PeerReport`], or why it gave none.
pub type PeerReports = Vec<(u64, Result<PeerReport, String>)>;

/// Answers a request another node's HTTP API passed to this one (bytes of [`crate::relay`]).
pub type ForwardAnswerer =
    Arc<dyn Fn(Vec<u8>) -> Pin<Box<dyn Future<Output = Vec<u8>> + Send>> + Send + Sync>;

/// A partition, its leader as a node knows it, and its replicas.
pub type PartitionLeader = (u32, Option<u64>, Vec<u64>);

/// What [`ClusterRoutes`] answers with.
pub type ClusterFuture<T> = Pin<Box<dyn Future<Output = Result<T, BrokerError>> + Send>>;

/// The cluster's side of the routes that must go through it.
pub trait ClusterRoutes: Send + Sync + 'static {
    /// Whether a publish to `topic` goes through the cluster: a replicated topic, or one this
    /// node does not have (which a publish creates replicated).
    fn publishes_to(&self, topic: &str) -> bool;

    /// Publishes at each partition's leader; the receipt and the nodes that served.
    fn publish(
        &self,
        topic: &str,
        partition: Option<u32>,
        records: RecordBatch,
    ) -> ClusterFuture<(PublishReceipt, Vec<u64>)>;

    /// Creates a replicated topic through the metadata group's leader, returning once this
    /// node has it too; the node that created it.
    fn create_topic(
        &self,
        name: &str,
        config: TopicConfig,
        if_not_exists: bool,
    ) -> ClusterFuture<u64>;

    /// Deletes `name` through the metadata group's leader when it is replicated (`None`: it is
    /// not, and this node's broker deletes it).
    fn delete_topic(&self, name: &str) -> Option<ClusterFuture<u64>>;

    /// Why this node cannot deliver `partitions` of `topic` (every partition when empty): it
    /// leads none of them, and only a partition's leader delivers it. `None` when it leads one
    /// of them, or the topic is not replicated.
    fn unserved(&self, topic: &str, partitions: &[u32]) -> Option<String>;

    /// This node's id.
    fn node_id(&self) -> u64;

    /// Each of `partitions` of `topic` (every partition when empty) with its leader as this node
    /// knows it and its replicas. The leader is `None` while one is elected, and on a node
    /// holding no replica of the partition (it does not hear that group's elections). `None`
    /// when the topic is not replicated.
    fn partition_leaders(&self, topic: &str, partitions: &[u32]) -> Option<Vec<PartitionLeader>>;

    /// Passes `request` (bytes of [`crate::relay`]) to `node`'s HTTP API over the peers'
    /// connection, waiting at most `timeout`: its answer's bytes. `not_leader` when it never got
    /// there, `storage_unavailable` when its answer did not come back.
    fn forward(&self, node: u64, request: Vec<u8>, timeout: Duration) -> ClusterFuture<Vec<u8>>;

    /// What answers the requests other nodes' HTTP APIs pass to this one.
    fn set_forward_answerer(&self, answerer: ForwardAnswerer);

    /// The cluster as this node sees it, without asking the others.
    fn overview(&self) -> ClusterOverview;

    /// Every other node's report, asked at once (bounded: a node that does not answer within
    /// a second is reported with why).
    fn peer_reports(&self) -> Pin<Box<dyn Future<Output = PeerReports> + Send>>;

    /// What this node tells a peer that asks for its resources (see [`Resources`]).
    fn set_resources_source(&self, source: Arc<dyn Fn() -> Vec<u8> + Send + Sync>);

    /// Admits `node`, reached by its peers at `cluster_addr`, through the metadata group's
    /// leader; the node that wrote it.
    fn add_node(&self, node: u64, cluster_addr: String) -> ClusterFuture<u64>;

    /// Removes `node` through the metadata group's leader; the node that wrote it.
    fn remove_node(&self, node: u64) -> ClusterFuture<u64>;
}

/// The cluster as one node sees it.
#[derive(Debug, Clone)]
pub struct ClusterOverview {
    pub cluster_id: String,
    pub node_id: u64,
    pub metadata_leader: Option<u64>,
    /// Every node: its id and, once known, where clients reach it.
    pub nodes: Vec<(u64, Option<String>)>,
    pub partitions: Vec<PartitionPlace>,
    /// A follower further behind than this makes its partition under-replicated.
    pub lag_entries_max: u64,
    pub elections: Vec<ElectionJson>,
    /// This node's groups.
    pub groups: Vec<GroupFacts>,
}

/// Where one partition of a replicated topic is.
#[derive(Debug, Clone)]
pub struct PartitionPlace {
    pub topic: String,
    pub partition: u32,
    pub group: u64,
    pub leader: Option<u64>,
    pub replicas: Vec<u64>,
}

/// Another node's answer: its [`Resources`] (as JSON bytes) and its groups.
#[derive(Debug, Clone)]
pub struct PeerReport {
    pub resources: Vec<u8>,
    pub groups: Vec<GroupFacts>,
}

/// A node's version and resources, as every node tells them to its peers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Resources {
    pub version: String,
    pub uptime_ms: u64,
    pub resident_bytes: Option<u64>,
    pub disk_total_bytes: Option<u64>,
    pub disk_available_bytes: Option<u64>,
    pub disk_used_bytes: Option<u64>,
}

impl Resources {
    /// The resources of the process that started at `started`, its data dir at `data_dir`.
    fn measure(started: Instant, data_dir: Option<&Path>) -> Resources {
        let disk = data_dir.and_then(crate::node::data_dir_info);
        Resources {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_ms: started.elapsed().as_millis() as u64,
            resident_bytes: crate::node::process_info().resident_bytes,
            disk_total_bytes: disk.as_ref().map(|d| d.total_bytes),
            disk_available_bytes: disk.as_ref().map(|d| d.available_bytes),
            disk_used_bytes: disk.as_ref().map(|d| d.used_bytes),
        }
    }
}

/// Tells `cluster` what this node answers its peers: the resources of the process serving
/// `state`, measured when asked.
pub(crate) fn answer_peers(cluster: &ClusterRouter, state: &AppState) {
    let (started, data_dir) = (state.started, state.config.data_dir.clone());
    cluster.0.set_resources_source(Arc::new(move || {
        let resources = Resources::measure(started, data_dir.as_deref());
        serde_json::to_vec(&resources).unwrap_or_default()
    }));
}

/// `GET /cluster`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ClusterJson {
    #[schema(example = "ferrymq")]
    pub cluster_id: String,
    /// The node that answered.
    pub node_id: u64,
    /// `null` while the metadata group elects a leader.
    pub metadata_leader: Option<u64>,
    /// The metadata group's voters as its leader reports them (`null` while none answered): a
    /// node admitted votes once it has caught up, a removed one no longer does.
    pub metadata_voters: Option<Vec<u64>>,
    pub nodes: Vec<NodeJson>,
    pub partitions: Vec<PartitionJson>,
    /// How many partitions are under-replicated.
    pub under_replicated: u64,
    /// Leader changes the answering node saw, newest first (at most 50).
    pub elections: Vec<ElectionJson>,
}

/// One node of the cluster; its resources are `null` when it did not answer (`up` false, and
/// `error` says why).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NodeJson {
    pub id: u64,
    /// Where clients reach it, once it announced it.
    #[schema(example = "127.0.0.1:7070")]
    pub addr: Option<String>,
    pub up: bool,
    pub error: Option<String>,
    pub version: Option<String>,
    pub uptime_ms: Option<u64>,
    pub resident_bytes: Option<u64>,
    pub disk_total_bytes: Option<u64>,
    pub disk_available_bytes: Option<u64>,
    pub disk_used_bytes: Option<u64>,
    /// Partitions it leads, and holds a replica of.
    pub leader_of: Option<u64>,
    pub replica_of: Option<u64>,
}

/// One partition of a replicated topic.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PartitionJson {
    pub topic: String,
    pub partition: u32,
    pub group: u64,
    /// `null` while its group elects a leader.
    pub leader: Option<u64>,
    pub replicas: Vec<u64>,
    /// The group's voters as its leader reports them: `replicas` once every move is done
    /// (`null` while no leader answered).
    pub voters: Option<Vec<u64>>,
    /// Each other replica and how many entries it is behind, as its leader reports (`null`:
    /// nothing known replicated to it: behind, down or unreachable).
    pub followers: Vec<FollowerFacts>,
    /// No leader, or a follower down, unknown or too far behind.
    pub under_replicated: bool,
}

/// A leader change: `leader` took `group` in `term`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ElectionJson {
    pub group: u64,
    /// `null` for the metadata group (group 0).
    pub topic: Option<String>,
    pub partition: Option<u32>,
    pub term: u64,
    pub leader: u64,
    /// When the answering node first saw it, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(cluster))
}

/// The cluster as this node sees it: every node's health, version and resources, each
/// replicated partition's leader, replicas and followers' lag, and recent elections (monitor or
/// admin role, as `/node`).
#[utoipa::path(get, path = "/cluster", tag = "service",
    responses(
        (status = 200, description = "The cluster", body = ClusterJson),
        (status = 401, description = "`authentication_failed`", body = crate::error::ErrorBody),
        (status = 403, description = "`forbidden`: the user has neither the monitor nor the admin role", body = crate::error::ErrorBody),
        (status = 404, description = "`not_clustered`: this broker runs alone", body = crate::error::ErrorBody),
    ))]
async fn cluster(State(state): State<AppState>) -> ApiResult<Json<ClusterJson>> {
    let Some(cluster) = state.config.cluster.clone() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_clustered",
            "this broker runs alone: start it with --node-id, --cluster-addr and --peers to \
             make it a node of a cluster",
        ));
    };
    let overview = cluster.0.overview();
    let mut reports: BTreeMap<u64, Result<(Resources, Vec<GroupFacts>), String>> = cluster
        .0
        .peer_reports()
        .await
        .into_iter()
        .map(|(node, report)| {
            let report = report.and_then(|r| {
                let resources = serde_json::from_slice(&r.resources)
                    .map_err(|e| format!("node {node} answered unreadably: {e}"))?;
                Ok((resources, r.groups))
            });
            (node, report)
        })
        .collect();
    let here = Resources::measure(state.started, state.config.data_dir.as_deref());
    reports.insert(overview.node_id, Ok((here, overview.groups.clone())));
    Ok(Json(assemble(overview, &reports)))
}

type Reports = BTreeMap<u64, Result<(Resources, Vec<GroupFacts>), String>>;

/// The page from this node's view and every node's report.
fn assemble(overview: ClusterOverview, reports: &Reports) -> ClusterJson {
    let groups_of = |node: u64| {
        reports
            .get(&node)
            .and_then(|r| r.as_ref().ok())
            .map(|r| &r.1)
    };
    let partitions: Vec<PartitionJson> = overview
        .partitions
        .into_iter()
        .map(|p| {
            let leading = p.leader.and_then(groups_of).and_then(|groups| {
                groups
                    .iter()
                    .find(|g| g.group == p.group && g.role == "leader")
            });
            let voters = leading.map(|g| g.voters.clone());
            let led = leading.map(|g| g.followers.clone());
            let followers = led.unwrap_or_else(|| {
                p.replicas
                    .iter()
                    .filter(|r| Some(**r) != p.leader)
                    .map(|&node| FollowerFacts {
                        node,
                        lag_entries: None,
                    })
                    .collect()
            });
            // A replica on a node that did not answer is behind from now on, whatever its
            // leader last measured.
            let down = |node: u64| !matches!(reports.get(&node), Some(Ok(_)));
            let under_replicated = p.leader.is_none()
                || followers.iter().any(|f| {
                    down(f.node)
                        || f.lag_entries
                            .is_none_or(|lag| lag > overview.lag_entries_max)
                });
            PartitionJson {
                topic: p.topic,
                partition: p.partition,
                group: p.group,
                leader: p.leader,
                replicas: p.replicas,
                voters,
                followers,
                under_replicated,
            }
        })
        .collect();
    let nodes = overview
        .nodes
        .into_iter()
        .map(|(id, addr)| node_json(id, addr, reports.get(&id)))
        .collect();
    let metadata_voters = overview
        .metadata_leader
        .and_then(groups_of)
        .and_then(|groups| groups.iter().find(|g| g.group == 0 && g.role == "leader"))
        .map(|g| g.voters.clone());
    ClusterJson {
        cluster_id: overview.cluster_id,
        node_id: overview.node_id,
        metadata_leader: overview.metadata_leader,
        metadata_voters,
        nodes,
        under_replicated: partitions.iter().filter(|p| p.under_replicated).count() as u64,
        partitions,
        elections: overview.elections,
    }
}

fn node_json(
    id: u64,
    addr: Option<String>,
    report: Option<&Result<(Resources, Vec<GroupFacts>), String>>,
) -> NodeJson {
    let (resources, groups, error) = match report {
        Some(Ok((resources, groups))) => (Some(resources), Some(groups), None),
        Some(Err(e)) => (None, None, Some(e.clone())),
        None => (None, None, Some(format!("node {id} was not asked"))),
    };
    let partitions = groups.map(|g| g.iter().filter(|g| g.topic.is_some()));
    NodeJson {
        id,
        addr,
        up: error.is_none(),
        error,
        version: resources.map(|r| r.version.clone()),
        uptime_ms: resources.map(|r| r.uptime_ms),
        resident_bytes: resources.and_then(|r| r.resident_bytes),
        disk_total_bytes: resources.and_then(|r| r.disk_total_bytes),
        disk_available_bytes: resources.and_then(|r| r.disk_available_bytes),
        disk_used_bytes: resources.and_then(|r| r.disk_used_bytes),
        leader_of: partitions
            .clone()
            .map(|mut g| g.by_ref().filter(|g| g.role == "leader").count() as u64),
        replica_of: partitions.map(|g| g.count() as u64),
    }
}

/// A node's [`ClusterRoutes`], shared by its connections.
#[derive(Clone)]
pub struct ClusterRouter(pub Arc<dyn ClusterRoutes>);

impl std::fmt::Debug for ClusterRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterRouter")
    }
}

/// Refuses, before a consumer is made, to consume on a node that leads none of the partitions
/// asked for: it would wait for ever. `503 not_leader` (with `Retry-After`), naming the leaders.
/// `ranges` are the inclusive partition ranges of the request (none: every partition).
pub(crate) fn check_serves(state: &AppState, topic: &str, ranges: &[(u32, u32)]) -> ApiResult<()> {
    check_serves_on(state.config.cluster.as_ref(), topic, ranges)
}

/// [`check_serves`] on the node whose cluster is `cluster` (none: it runs alone).
pub(crate) fn check_serves_on(
    cluster: Option<&ClusterRouter>,
    topic: &str,
    ranges: &[(u32, u32)],
) -> ApiResult<()> {
    let Some(cluster) = cluster else {
        return Ok(());
    };
    let partitions = partition_list(ranges);
    let unserved = cluster.0.unserved(topic, &partitions);
    match unserved {
        None => Ok(()),
        Some(message) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ferrymq_protocol::ErrorCode::NotLeader.as_str(),
            message,
        )),
    }
}

/// The partitions of inclusive `ranges` (none: every partition). A topic has at most 1024
/// partitions: numbers past them are the broker's to refuse.
pub(crate) fn partition_list(ranges: &[(u32, u32)]) -> Vec<u32> {
    ranges
        .iter()
        .flat_map(|&(first, last)| first..=last.min(first.saturating_add(1024)))
        .collect()
}

/// The `FerryMQ-Node` value for `nodes`: their ids, comma-separated.
pub(crate) fn node_header(nodes: &[u64]) -> HeaderValue {
    let text: Vec<String> = nodes.iter().map(u64::to_string).collect();
    HeaderValue::from_str(&text.join(",")).expect("digits and commas")
}

/// The response headers of a request the cluster served at `node` (none without one).
pub(crate) fn served_by(node: Option<u64>) -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    if let Some(node) = node {
        headers.insert(NODE_HEADER, node_header(&[node]));
    }
    headers
}

/// `token`, naming this node when `topic` is replicated, so that acks through any node reach it.
pub(crate) fn tagged(cluster: Option<&ClusterRouter>, topic: &str, token: String) -> String {
    match cluster {
        Some(cluster) if cluster.0.partition_leaders(topic, &[]).is_some() => {
            format!("{}:{token}", cluster.0.node_id())
        }
        _ => token,
    }
}
