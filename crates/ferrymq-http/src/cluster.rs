//! In cluster mode, the requests that go through the cluster rather than straight to this
//! node's broker: publishes to replicated topics (to each partition's leader, wherever it runs)
//! and topics' creation and deletion (through the metadata group's leader). The server gives
//! the HTTP layer a [`ClusterRoutes`]; without one (a node running alone) every route uses the
//! broker as before.
//!
//! A response served through the cluster names the node or nodes that served it in the
//! `FerryMQ-Node` header, so that a caller sees where its request went and what a hop cost.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ferrymq_broker::{BrokerError, PublishReceipt};
use ferrymq_protocol::{RecordBatch, TopicConfig};
use http::HeaderValue;

/// The response header naming the nodes that served a request routed through the cluster.
pub const NODE_HEADER: &str = "ferrymq-node";

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
}

/// A node's [`ClusterRoutes`], shared by its connections.
#[derive(Clone)]
pub struct ClusterRouter(pub Arc<dyn ClusterRoutes>);

impl std::fmt::Debug for ClusterRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterRouter")
    }
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
