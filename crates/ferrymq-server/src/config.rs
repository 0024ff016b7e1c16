//! Server settings. `ferrymq serve` fills this from flags, `FERRYMQ_*` environment variables and a
//! TOML file; tests and embedders build it directly.

use std::net::SocketAddr;
use std::path::PathBuf;

use ferrymq_broker::BrokerConfig;
use ferrymq_protocol::limits::{frame_bytes_needed, FRAME_BYTES_DEFAULT, HEARTBEAT_MS_DEFAULT};

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address of the binary protocol listener.
    pub tcp_addr: SocketAddr,
    /// Address of the HTTP listener.
    pub http_addr: SocketAddr,
    /// Where durable state lives.
    pub data_dir: PathBuf,
    /// Connections served at once by each listener (the HTTP one takes the same limit); past
    /// this a new connection gets `too_many_connections`.
    pub connections_max: usize,
    /// Largest frame accepted; raised automatically to fit the largest message.
    pub frame_bytes_max: u32,
    /// Heartbeat offered to clients that do not ask for one.
    pub heartbeat_ms_default: u32,
    /// Bytes a connection may have queued for sending before the server stops reading its
    /// requests and stops delivering to it: the bound on a slow reader's memory.
    pub outbound_bytes_max: usize,
    /// Consumers one connection may attach.
    pub consumers_per_connection_max: usize,
    /// Deliveries per DELIVER frame and bytes per frame: large enough to amortise syscalls,
    /// small enough to interleave consumers and responses fairly.
    pub deliver_batch_count_max: u32,
    pub deliver_batch_bytes_max: usize,
    /// How long shutdown waits for connections to finish before closing them.
    pub shutdown_grace_ms: u64,
    /// Connections one user may hold at once on each listener; 0: no limit beyond
    /// `connections_max`. Keeps one leaked credential or runaway service from taking them all.
    pub connections_per_user_max: usize,
    pub broker: BrokerConfig,
    /// This node's part of a cluster; `None` for a single node.
    pub cluster: Option<std::sync::Arc<crate::cluster::Cluster>>,
}

impl ServerConfig {
    /// The configured frame limit, or the smallest frame that fits the largest message.
    pub fn effective_frame_bytes_max(&self) -> usize {
        (self.frame_bytes_max as usize).max(frame_bytes_needed(self.broker.message_body_bytes_max))
    }
}

pub const TCP_ADDR_DEFAULT: &str = "127.0.0.1:7070";
pub const HTTP_ADDR_DEFAULT: &str = "127.0.0.1:7080";
pub const DATA_DIR_DEFAULT: &str = "./ferrymq-data";

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            tcp_addr: TCP_ADDR_DEFAULT.parse().expect("valid default address"),
            http_addr: HTTP_ADDR_DEFAULT.parse().expect("valid default address"),
            data_dir: PathBuf::from(DATA_DIR_DEFAULT),
            // Each idle connection costs a few KiB; 10 k stays far below memory limits.
            connections_max: 10_000,
            frame_bytes_max: FRAME_BYTES_DEFAULT,
            heartbeat_ms_default: HEARTBEAT_MS_DEFAULT,
            outbound_bytes_max: 8 * 1024 * 1024,
            consumers_per_connection_max: 1024,
            deliver_batch_count_max: 4096,
            deliver_batch_bytes_max: 1024 * 1024,
            shutdown_grace_ms: 5_000,
            connections_per_user_max: 0,
            broker: BrokerConfig::default(),
            cluster: None,
        }
    }
}
