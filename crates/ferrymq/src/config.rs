//! `ferrymq serve` settings: flags, then `FERRYMQ_*` environment variables, then a TOML file, then
//! the embedded defaults, in that order of precedence. Clap resolves flags over environment; the
//! file fills whatever neither set.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use ferrymq_protocol::limits::{frame_bytes_needed, MESSAGE_BODY_BYTES_CEILING, PARTITIONS_MAX};
use ferrymq_protocol::{FsyncPolicy, OverflowPolicy, Storage};
use ferrymq_server::cluster::{split_host_port, ClusterSettings, GroupTiming};
use ferrymq_server::{PeerTlsFiles, ServerConfig, TlsFiles};
use ferrymq_storage::SEGMENT_BYTES_CEILING;
use serde::Deserialize;

/// Most settled messages a subscription may be asked to remember per partition.
const STATUS_HISTORY_MAX: usize = 1_000_000;

#[derive(Args, Debug, Default, Clone)]
pub struct Settings {
    /// TOML file with settings (flags and environment variables override it).
    #[arg(long, env = "FERRYMQ_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Directory for durable state [default: ./ferrymq-data]
    #[arg(long, env = "FERRYMQ_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address of the binary protocol listener [default: 127.0.0.1:7070]
    #[arg(long, env = "FERRYMQ_TCP_ADDR", value_name = "ADDR")]
    pub tcp_addr: Option<SocketAddr>,
    /// Address of the HTTP listener [default: 127.0.0.1:7080]
    #[arg(long, env = "FERRYMQ_HTTP_ADDR", value_name = "ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// Log filter: error, warn, info, debug, trace, or a tracing directive [default: info]
    #[arg(long, env = "FERRYMQ_LOG", value_name = "FILTER")]
    pub log: Option<String>,
    /// Log lines as `text` (for people) or `json` (one object per line, for collectors)
    /// [default: text]
    #[arg(long, env = "FERRYMQ_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Largest message body in bytes [default: 262144]
    #[arg(long, env = "FERRYMQ_MESSAGE_MAX_BYTES", value_name = "BYTES")]
    pub message_max_bytes: Option<u32>,
    /// Largest frame of the binary protocol in bytes, raised to fit one message of
    /// --message-max-bytes and the largest ack (0: just that) [default: 16777216]
    #[arg(long, env = "FERRYMQ_FRAME_MAX_BYTES", value_name = "BYTES")]
    pub frame_max_bytes: Option<u32>,
    /// Connections served at once by each listener, binary protocol and HTTP [default: 10000]
    #[arg(long, env = "FERRYMQ_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,
    /// Create topics on first publish or subscribe [default: true]
    #[arg(long, env = "FERRYMQ_AUTO_CREATE_TOPICS", value_name = "BOOL")]
    pub auto_create_topics: Option<bool>,
    /// Partitions of topics created without a count [default: 1]
    #[arg(long, env = "FERRYMQ_DEFAULT_PARTITIONS", value_name = "N")]
    pub default_partitions: Option<u32>,
    /// Messages a memory topic keeps at most, by default [default: 5000000]
    #[arg(long, env = "FERRYMQ_TOPIC_MAX_MESSAGES", value_name = "N")]
    pub topic_max_messages: Option<u64>,
    /// Bytes a memory topic keeps at most, by default [default: 536870912]
    #[arg(long, env = "FERRYMQ_TOPIC_MAX_BYTES", value_name = "BYTES")]
    pub topic_max_bytes: Option<u64>,
    /// What a full topic does by default: drop-oldest or reject [default: drop-oldest]
    #[arg(long, env = "FERRYMQ_TOPIC_OVERFLOW", value_name = "POLICY")]
    pub topic_overflow: Option<String>,
    /// Default time a consumer has to ack, in milliseconds [default: 30000]
    #[arg(long, env = "FERRYMQ_ACK_TIMEOUT_MS", value_name = "MS")]
    pub ack_timeout_ms: Option<u32>,
    /// Default deliveries of a message before it is given up [default: 5]
    #[arg(long, env = "FERRYMQ_MAX_ATTEMPTS", value_name = "N")]
    pub max_attempts: Option<u32>,
    /// Heartbeat offered to clients, in milliseconds [default: 5000]
    #[arg(long, env = "FERRYMQ_HEARTBEAT_MS", value_name = "MS")]
    pub heartbeat_ms: Option<u32>,
    /// Threads serving connections [default: one per CPU]
    #[arg(long, env = "FERRYMQ_WORKER_THREADS", value_name = "N")]
    pub worker_threads: Option<usize>,
    /// Storage of topics created without one (auto-created ones too): disk or memory [default: disk]
    #[arg(long, env = "FERRYMQ_DEFAULT_STORAGE", value_name = "STORAGE")]
    pub default_storage: Option<String>,
    /// Disk topics' fsync policy by default: always, interval:<ms> or never [default: always]
    #[arg(long, env = "FERRYMQ_FSYNC", value_name = "POLICY")]
    pub fsync: Option<String>,
    /// Disk topics delete messages older than this many milliseconds by default; 0 keeps them
    /// forever [default: 604800000, a week]
    #[arg(long, env = "FERRYMQ_RETENTION_MS", value_name = "MS")]
    pub retention_ms: Option<u64>,
    /// How long topics remember deduplication ids (x-ferrymq-dedup-id, Idempotency-Key), 1 ms to
    /// a day [default: 120000, two minutes]
    #[arg(long, env = "FERRYMQ_DEDUP_WINDOW_MS", value_name = "MS")]
    pub dedup_window_ms: Option<u64>,
    /// Size of a disk partition's segment files, the unit retention deletes [default: 134217728]
    #[arg(long, env = "FERRYMQ_SEGMENT_BYTES", value_name = "BYTES")]
    pub segment_bytes: Option<u64>,
    /// Acked and dead-lettered messages each subscription remembers per partition for status
    /// queries and listings (in memory, about 50 bytes each plus ack results); 0 keeps none
    /// [default: 1000]
    #[arg(long, env = "FERRYMQ_STATUS_HISTORY", value_name = "N")]
    pub status_history: Option<usize>,
    /// Allow listening on non-loopback addresses without authentication.
    #[arg(long, env = "FERRYMQ_INSECURE")]
    pub insecure: bool,
    /// On first start (no users yet), create the admin user with the password in this file
    /// (its first line). FERRYMQ_ADMIN_PASSWORD does the same from the environment.
    #[arg(long, env = "FERRYMQ_ADMIN_PASSWORD_FILE", value_name = "PATH")]
    pub admin_password_file: Option<PathBuf>,
    /// Name of the admin user created on first start [default: admin]
    #[arg(long, env = "FERRYMQ_ADMIN_USER", value_name = "NAME")]
    pub admin_user: Option<String>,
    /// A host name the HTTP API answers to besides IP addresses and localhost (requests naming
    /// another Host are refused); repeat or separate with commas
    #[arg(
        long = "http-host",
        env = "FERRYMQ_HTTP_HOSTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub http_hosts: Vec<String>,
    /// Connections one user may hold at once on each listener; 0: no limit [default: 0]
    #[arg(long, env = "FERRYMQ_MAX_CONNECTIONS_PER_USER", value_name = "N")]
    pub max_connections_per_user: Option<usize>,
    /// Failed logins one address gets at full speed before its answers are slowed (doubling
    /// from 100 ms to 5 s) [default: 3]
    #[arg(long, env = "FERRYMQ_AUTH_FAILURES_FREE", value_name = "N")]
    pub auth_failures_free: Option<u32>,
    /// How long a dashboard login lasts, in milliseconds, from 1 second to 30 days
    /// [default: 28800000, 8 hours]
    #[arg(long, env = "FERRYMQ_SESSION_LIFETIME_MS", value_name = "MS")]
    pub session_lifetime_ms: Option<u64>,
    /// PEM certificate chain: with --tls-key, both listeners (binary protocol and HTTP) serve TLS
    /// only. Reloaded with the key on SIGHUP.
    #[arg(long, env = "FERRYMQ_TLS_CERT", value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert
    #[arg(long, env = "FERRYMQ_TLS_KEY", value_name = "PATH")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificates of the authorities whose client certificates log in (mutual TLS): a
    /// certificate's common name, else its first DNS name, is the user it acts as
    #[arg(long, env = "FERRYMQ_TLS_CLIENT_CA", value_name = "PATH")]
    pub tls_client_ca: Option<PathBuf>,
    /// Cluster mode: this node's id among --peers (with --cluster-addr and --peers)
    #[arg(long, env = "FERRYMQ_NODE_ID", value_name = "ID")]
    pub node_id: Option<u64>,
    /// Cluster mode: the cluster's id; a node of another cluster is refused [default: ferrymq]
    #[arg(long, env = "FERRYMQ_CLUSTER_ID", value_name = "ID")]
    pub cluster_id: Option<String>,
    /// Cluster mode: where this node listens for its peers
    #[arg(long, env = "FERRYMQ_CLUSTER_ADDR", value_name = "ADDR")]
    pub cluster_addr: Option<SocketAddr>,
    /// Cluster mode: every node, this one included, as ID=HOST:PORT,... (their --cluster-addr)
    #[arg(long, env = "FERRYMQ_PEERS", value_name = "LIST")]
    pub peers: Option<String>,
    /// Cluster mode: where clients reach this node, as HOST:PORT, told to its peers so that a
    /// client sent elsewhere is pointed here [default: --tcp-addr; when that is 0.0.0.0 or
    /// [::], this node's host in --peers with --tcp-addr's port]
    #[arg(long, env = "FERRYMQ_ADVERTISE_ADDR", value_name = "HOST:PORT")]
    pub advertise_addr: Option<String>,
    /// Cluster mode: a follower hearing no leader for this long (up to 1.5 times it) starts an
    /// election [default: 500]
    #[arg(long, env = "FERRYMQ_ELECTION_TIMEOUT_MS", value_name = "MS")]
    pub election_timeout_ms: Option<u64>,
    /// Cluster mode: join a running cluster instead of forming a new one; the node waits until
    /// `ferrymq cluster add-node` admits it (its --peers name every member and itself)
    #[arg(long, env = "FERRYMQ_JOIN")]
    pub join: bool,
    /// Cluster mode: each Raft group takes a snapshot after this many log entries and drops the
    /// entries below it (message bodies stay in the partition's own log) [default: 8192]
    #[arg(long, env = "FERRYMQ_SNAPSHOT_ENTRIES", value_name = "N")]
    pub snapshot_entries: Option<u64>,
    /// Cluster mode: this node's PEM certificate for mutual TLS with its peers (with
    /// --cluster-tls-key and --cluster-tls-ca); it must name the node's cluster address (an IP
    /// subject alternative name)
    #[arg(long, env = "FERRYMQ_CLUSTER_TLS_CERT", value_name = "PATH")]
    pub cluster_tls_cert: Option<PathBuf>,
    /// Cluster mode: PEM private key of --cluster-tls-cert
    #[arg(long, env = "FERRYMQ_CLUSTER_TLS_KEY", value_name = "PATH")]
    pub cluster_tls_key: Option<PathBuf>,
    /// Cluster mode: PEM certificates of the authority that signed every node's certificate
    #[arg(long, env = "FERRYMQ_CLUSTER_TLS_CA", value_name = "PATH")]
    pub cluster_tls_ca: Option<PathBuf>,
}

/// The Raft timing of `--election-timeout-ms` (`election_ms`): a follower that hears no leader
/// for `election_ms` to 1.5 × `election_ms` starts an election.
///
/// openraft (0.9) makes a follower that has heard a leader wait its leader lease, which is the
/// configured maximum election timeout, *before* the randomized timeout drawn from
/// `min..max`, and refuse votes during that lease. So a follower stands after `max + min` to
/// `2 × max` of silence: with `min = E/4` and `max = 3E/4` that is `E` to `1.5 E` (with `E`
/// and `2E` it would be `3E` to `4E`). A candidate whose election failed tries again
/// after `E/4` to `3E/4`; heartbeats go every `E/6`, below the lease.
pub(crate) fn group_timing(election_ms: u64) -> GroupTiming {
    GroupTiming {
        heartbeat_interval_ms: (election_ms / 6).max(10),
        election_timeout_min_ms: election_ms / 4,
        election_timeout_max_ms: election_ms * 3 / 4,
        rpc_timeout_ms: (election_ms / 2).max(50),
        ..GroupTiming::default()
    }
}

/// The TOML file's keys: the same names as the flags, with underscores.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    data_dir: Option<PathBuf>,
    tcp_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
    log: Option<String>,
    log_format: Option<String>,
    message_max_bytes: Option<u32>,
    frame_max_bytes: Option<u32>,
    max_connections: Option<usize>,
    auto_create_topics: Option<bool>,
    default_partitions: Option<u32>,
    topic_max_messages: Option<u64>,
    topic_max_bytes: Option<u64>,
    topic_overflow: Option<String>,
    ack_timeout_ms: Option<u32>,
    max_attempts: Option<u32>,
    heartbeat_ms: Option<u32>,
    worker_threads: Option<usize>,
    default_storage: Option<String>,
    fsync: Option<String>,
    retention_ms: Option<u64>,
    dedup_window_ms: Option<u64>,
    segment_bytes: Option<u64>,
    status_history: Option<usize>,
    insecure: Option<bool>,
    admin_password_file: Option<PathBuf>,
    admin_user: Option<String>,
    max_connections_per_user: Option<usize>,
    http_hosts: Option<Vec<String>>,
    auth_failures_free: Option<u32>,
    session_lifetime_ms: Option<u64>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    node_id: Option<u64>,
    cluster_id: Option<String>,
    cluster_addr: Option<SocketAddr>,
    peers: Option<String>,
    advertise_addr: Option<String>,
    election_timeout_ms: Option<u64>,
    snapshot_entries: Option<u64>,
    join: Option<bool>,
    cluster_tls_cert: Option<PathBuf>,
    cluster_tls_key: Option<PathBuf>,
    cluster_tls_ca: Option<PathBuf>,
}

/// The resolved settings of a server run.
pub struct Resolved {
    pub server: ServerConfig,
    /// Segment size of disk partitions.
    pub segment_bytes: u64,
    /// `None`: one per CPU.
    pub worker_threads: Option<usize>,
    pub log: String,
    /// Log lines as JSON objects rather than text.
    pub log_json: bool,
    pub insecure: bool,
    /// The first admin to create when no user exists: (name, password).
    pub admin: Option<(String, String)>,
    /// Host names the HTTP API answers to besides IP literals and localhost.
    pub http_hosts: Vec<String>,
    pub auth_failures_free: Option<u32>,
    /// How long a dashboard session lasts from its login.
    pub session_lifetime: std::time::Duration,
    /// Both listeners serve TLS with these files; `None`: plaintext.
    pub tls: Option<TlsFiles>,
    /// Cluster mode; `None`: a single node.
    pub cluster: Option<ClusterSettings>,
}

/// The longest a dashboard session may last: a stolen cookie stays useful no longer.
const SESSION_LIFETIME_MS_MAX: u64 = 30 * 24 * 3600 * 1000;

fn read_file(path: &Path) -> anyhow::Result<FileSettings> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
}

/// `1=127.0.0.1:7090,2=node2:7090,...`: every node's id and cluster address, an IP address or
/// a host name with a port (names are looked up on each connection, not here).
fn parse_peers(list: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((id, addr)) = item.split_once('=') else {
            bail!("'{item}' is not ID=HOST:PORT");
        };
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("'{id}' in '{item}' is not a node id"))?;
        let addr = addr.trim();
        split_host_port(addr).map_err(|e| anyhow::anyhow!("{e} (in '{item}')"))?;
        if peers.insert(id, addr.to_owned()).is_some() {
            bail!("node {id} is listed twice");
        }
    }
    if peers.is_empty() {
        bail!("no peers listed");
    }
    Ok(peers)
}

/// Where clients reach this node: `advertise` when given; else the client listener, unless it
/// listens on every interface (0.0.0.0 or [::]), where this node's host in `--peers` (the name
/// its peers reach it by) with the listener's port is the best guess.
fn advertised(
    advertise: Option<&str>,
    tcp_addr: SocketAddr,
    own_peer: &str,
) -> anyhow::Result<String> {
    if let Some(addr) = advertise {
        split_host_port(addr).map_err(anyhow::Error::msg)?;
        return Ok(addr.to_owned());
    }
    if !tcp_addr.ip().is_unspecified() {
        return Ok(tcp_addr.to_string());
    }
    let (host, _) = split_host_port(own_peer).map_err(anyhow::Error::msg)?;
    Ok(match host.contains(':') {
        true => format!("[{host}]:{}", tcp_addr.port()),
        false => format!("{host}:{}", tcp_addr.port()),
    })
}

/// The `data_dir` of a TOML settings file, for commands that need only that setting.
pub fn data_dir_from_file(path: &Path) -> anyhow::Result<Option<PathBuf>> {
    Ok(read_file(path)?.data_dir)
}

fn parse_overflow(value: &str) -> anyhow::Result<OverflowPolicy> {
    match value {
        "drop-oldest" | "drop_oldest" => Ok(OverflowPolicy::DropOldest),
        "reject" => Ok(OverflowPolicy::Reject),
        other => bail!("must be drop-oldest or reject, not '{other}'"),
    }
}

/// A setting from the flags or the environment, else from the file.
macro_rules! pick {
    ($settings:expr, $file:expr, $field:ident) => {
        $settings.$field.clone().or($file.$field.clone())
    };
}

/// Where the value of a setting came from, so that an error names what to fix.
macro_rules! origin {
    ($settings:expr, $field:ident) => {
        $settings.origin(
            stringify!($field),
            $settings.$field.as_ref().map(|v| v.to_string()),
        )
    };
}

impl Settings {
    /// Names the source of `field`'s value for an error: the environment variable when it holds
    /// the value given (clap takes a flag over it), else the flag, else the file's key.
    fn origin(&self, field: &str, given: Option<String>) -> String {
        let env = format!("FERRYMQ_{}", field.to_ascii_uppercase());
        match given {
            Some(value) if std::env::var(&env).is_ok_and(|v| v.trim() == value) => {
                format!("{env}={value}")
            }
            Some(_) => format!("--{}", field.replace('_', "-")),
            None => match &self.config {
                Some(path) => format!("{field} in {}", path.display()),
                None => field.to_owned(),
            },
        }
    }

    pub fn resolve(&self) -> anyhow::Result<Resolved> {
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => FileSettings::default(),
        };
        let mut server = ServerConfig::default();
        self.apply_listeners(&file, &mut server)?;
        self.apply_topic_defaults(&file, &mut server)?;
        self.apply_storage_defaults(&file, &mut server)?;
        let segment_bytes = pick!(self, file, segment_bytes).unwrap_or(128 * 1024 * 1024);
        if !(4096..=SEGMENT_BYTES_CEILING).contains(&segment_bytes) {
            bail!(
                "{}: must be 4096..={SEGMENT_BYTES_CEILING}, not {segment_bytes}",
                origin!(self, segment_bytes)
            );
        }
        let worker_threads = pick!(self, file, worker_threads);
        if worker_threads == Some(0) {
            bail!("{}: must be at least 1", origin!(self, worker_threads));
        }
        let log = pick!(self, file, log).unwrap_or_else(|| "info".to_owned());
        let log_json = match pick!(self, file, log_format).as_deref() {
            None | Some("text") => false,
            Some("json") => true,
            Some(other) => bail!("log_format must be text or json, not '{other}'"),
        };
        let insecure = self.insecure || file.insecure.unwrap_or(false);
        if let Some(v) = pick!(self, file, max_connections_per_user) {
            server.connections_per_user_max = v;
        }
        let admin = self.admin_account(&file)?;
        let http_hosts = match self.http_hosts.is_empty() {
            true => file.http_hosts.clone().unwrap_or_default(),
            false => self.http_hosts.clone(),
        };
        let session_lifetime = self.session_lifetime(&file)?;
        let tls = self.tls_files(&file)?;
        let cluster = self.cluster(&file, &server)?;
        Ok(Resolved {
            server,
            segment_bytes,
            worker_threads,
            log,
            log_json,
            insecure,
            admin,
            http_hosts,
            auth_failures_free: pick!(self, file, auth_failures_free),
            session_lifetime,
            tls,
            cluster,
        })
    }

    /// Cluster mode, when a node id is set: the other cluster settings are then required.
    fn cluster(
        &self,
        file: &FileSettings,
        server: &ServerConfig,
    ) -> anyhow::Result<Option<ClusterSettings>> {
        let node_id = pick!(self, file, node_id);
        let cluster_addr = pick!(self, file, cluster_addr);
        let peers = pick!(self, file, peers);
        let Some(node_id) = node_id else {
            if cluster_addr.is_some() || peers.is_some() {
                bail!(
                    "--cluster-addr and --peers need --node-id: cluster mode starts with a node id"
                );
            }
            return Ok(None);
        };
        let (Some(cluster_addr), Some(peers)) = (cluster_addr, peers) else {
            bail!("--node-id needs --cluster-addr and --peers (every node as ID=HOST:PORT)");
        };
        let peers = parse_peers(&peers).with_context(|| origin!(self, peers))?;
        let advertise = pick!(self, file, advertise_addr);
        let own = peers.get(&node_id).map(String::as_str).unwrap_or_default();
        let client_addr = match advertised(advertise.as_deref(), server.tcp_addr, own) {
            Ok(addr) => addr,
            Err(e) if advertise.is_some() => {
                return Err(e).with_context(|| origin!(self, advertise_addr));
            }
            // This node is missing from --peers: validate() below says so.
            Err(_) => server.tcp_addr.to_string(),
        };
        let election_ms = pick!(self, file, election_timeout_ms).unwrap_or(500);
        if !(100..=60_000).contains(&election_ms) {
            bail!(
                "{}: must be 100..=60000, not {election_ms}",
                origin!(self, election_timeout_ms)
            );
        }
        let mut timing = group_timing(election_ms);
        if let Some(n) = pick!(self, file, snapshot_entries) {
            if !(16..=10_000_000).contains(&n) {
                bail!(
                    "{}: must be 16..=10000000, not {n}",
                    origin!(self, snapshot_entries)
                );
            }
            timing.snapshot_every = n;
            // A replica this far behind catches up from the log, not from a snapshot.
            timing.entries_kept = (n / 8).max(8);
        }
        let settings = ClusterSettings {
            cluster_id: pick!(self, file, cluster_id).unwrap_or_else(|| "ferrymq".to_owned()),
            node_id,
            cluster_addr,
            peers,
            client_addr,
            timing,
            write_timeout: std::time::Duration::from_secs(5),
            tls: self.cluster_tls_files(file)?,
            join: self.join || file.join.unwrap_or(false),
        };
        settings.validate().map_err(anyhow::Error::msg)?;
        Ok(Some(settings))
    }

    /// The listeners and their limits: addresses, message and frame sizes, connections.
    fn apply_listeners(
        &self,
        file: &FileSettings,
        server: &mut ServerConfig,
    ) -> anyhow::Result<()> {
        if let Some(v) = pick!(self, file, data_dir) {
            server.data_dir = v;
        }
        if let Some(v) = pick!(self, file, tcp_addr) {
            server.tcp_addr = v;
        }
        if let Some(v) = pick!(self, file, http_addr) {
            server.http_addr = v;
        }
        if let Some(v) = pick!(self, file, message_max_bytes) {
            if v == 0 || v > MESSAGE_BODY_BYTES_CEILING {
                bail!(
                    "{}: must be 1..={MESSAGE_BODY_BYTES_CEILING}, not {v}",
                    origin!(self, message_max_bytes)
                );
            }
            server.broker.message_body_bytes_max = v;
        }
        if let Some(v) = pick!(self, file, frame_max_bytes) {
            let ceiling = frame_bytes_needed(MESSAGE_BODY_BYTES_CEILING);
            if v as usize > ceiling {
                bail!(
                    "{}: must be at most {ceiling}, not {v}",
                    origin!(self, frame_max_bytes)
                );
            }
            server.frame_bytes_max = v;
        }
        if let Some(v) = pick!(self, file, max_connections) {
            if v == 0 {
                bail!("{}: must be at least 1", origin!(self, max_connections));
            }
            server.connections_max = v;
        }
        Ok(())
    }

    /// Defaults of new topics and subscriptions: partitions, limits, acks and heartbeats.
    fn apply_topic_defaults(
        &self,
        file: &FileSettings,
        server: &mut ServerConfig,
    ) -> anyhow::Result<()> {
        if let Some(v) = pick!(self, file, auto_create_topics) {
            server.broker.auto_create_topics = v;
        }
        if let Some(v) = pick!(self, file, default_partitions) {
            if v == 0 || v > PARTITIONS_MAX {
                bail!(
                    "{}: must be 1..={PARTITIONS_MAX}, not {v}",
                    origin!(self, default_partitions)
                );
            }
            server.broker.topic_defaults.partitions = v;
        }
        if let Some(v) = pick!(self, file, topic_max_messages) {
            server.broker.topic_defaults.max_messages = v.max(1);
        }
        if let Some(v) = pick!(self, file, topic_max_bytes) {
            server.broker.topic_defaults.max_bytes = v.max(1);
        }
        if let Some(v) = pick!(self, file, topic_overflow) {
            server.broker.topic_defaults.overflow =
                parse_overflow(&v).with_context(|| origin!(self, topic_overflow))?;
        }
        if let Some(v) = pick!(self, file, ack_timeout_ms) {
            server.broker.ack_timeout_ms_default = v;
        }
        if let Some(v) = pick!(self, file, max_attempts) {
            if v == 0 {
                bail!("{}: must be at least 1", origin!(self, max_attempts));
            }
            server.broker.max_attempts_default = v;
        }
        if let Some(v) = pick!(self, file, heartbeat_ms) {
            server.heartbeat_ms_default = v;
        }
        Ok(())
    }

    /// Where new topics keep their messages and for how long, and the status history.
    fn apply_storage_defaults(
        &self,
        file: &FileSettings,
        server: &mut ServerConfig,
    ) -> anyhow::Result<()> {
        server.broker.topic_defaults.storage = match pick!(self, file, default_storage).as_deref() {
            None | Some("disk") => Storage::Disk,
            Some("memory") => Storage::Memory,
            Some(other) => bail!(
                "{}: must be disk or memory, not '{other}'",
                origin!(self, default_storage)
            ),
        };
        if let Some(v) = pick!(self, file, fsync) {
            server.broker.topic_defaults.fsync = v
                .parse::<FsyncPolicy>()
                .map_err(|e| anyhow::anyhow!("{}: {e}", origin!(self, fsync)))?;
            if server.broker.topic_defaults.fsync == FsyncPolicy::Default {
                bail!(
                    "{}: must be always, interval:<ms> or never",
                    origin!(self, fsync)
                );
            }
        }
        if let Some(v) = pick!(self, file, retention_ms) {
            server.broker.topic_defaults.retention_ms = if v == 0 { u64::MAX } else { v };
        }
        if let Some(v) = pick!(self, file, dedup_window_ms) {
            if v == 0 || v > ferrymq_broker::DEDUP_WINDOW_MS_MAX {
                bail!(
                    "{}: {v} is not 1 to {} ms",
                    origin!(self, dedup_window_ms),
                    ferrymq_broker::DEDUP_WINDOW_MS_MAX
                );
            }
            server.broker.topic_defaults.dedup_window_ms = v;
        }
        if let Some(v) = pick!(self, file, status_history) {
            if v > STATUS_HISTORY_MAX {
                bail!(
                    "{}: must be at most {STATUS_HISTORY_MAX}, not {v}",
                    origin!(self, status_history)
                );
            }
            server.broker.status_history = v;
        }
        Ok(())
    }

    /// The admin user created on first start: its name and password, when one is given.
    fn admin_account(&self, file: &FileSettings) -> anyhow::Result<Option<(String, String)>> {
        let admin_user = pick!(self, file, admin_user).unwrap_or_else(|| "admin".to_owned());
        let admin_password = match pick!(self, file, admin_password_file) {
            Some(path) => {
                let text = std::fs::read_to_string(&path).with_context(|| {
                    format!("cannot read the admin password file {}", path.display())
                })?;
                Some(text.lines().next().unwrap_or("").to_owned())
            }
            None => std::env::var("FERRYMQ_ADMIN_PASSWORD").ok(),
        };
        let admin = admin_password.map(|password| (admin_user, password));
        Ok(admin)
    }

    /// How long a dashboard login lasts.
    fn session_lifetime(&self, file: &FileSettings) -> anyhow::Result<std::time::Duration> {
        let session_lifetime = match pick!(self, file, session_lifetime_ms) {
            None => ferrymq_http::session::SESSION_LIFETIME_DEFAULT,
            Some(ms) if (1000..=SESSION_LIFETIME_MS_MAX).contains(&ms) => {
                std::time::Duration::from_millis(ms)
            }
            Some(ms) => bail!(
                "{}: must be 1000..={SESSION_LIFETIME_MS_MAX} (1 second to 30 days), not {ms}",
                origin!(self, session_lifetime_ms)
            ),
        };
        Ok(session_lifetime)
    }

    /// The files of mutual TLS between the nodes: all three or none.
    fn cluster_tls_files(&self, file: &FileSettings) -> anyhow::Result<Option<PeerTlsFiles>> {
        match (
            pick!(self, file, cluster_tls_cert),
            pick!(self, file, cluster_tls_key),
            pick!(self, file, cluster_tls_ca),
        ) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(PeerTlsFiles { cert, key, ca })),
            (cert, key, ca) => {
                let missing: Vec<&str> = [
                    (cert.is_none(), "--cluster-tls-cert"),
                    (key.is_none(), "--cluster-tls-key"),
                    (ca.is_none(), "--cluster-tls-ca"),
                ]
                .into_iter()
                .filter_map(|(missing, flag)| missing.then_some(flag))
                .collect();
                bail!(
                    "TLS between the nodes needs a certificate, its key and the cluster's \
                     authority: set {} too (or none of the three for plaintext)",
                    missing.join(" and ")
                )
            }
        }
    }

    /// The TLS certificate, key and client authorities: all or none of certificate and key.
    fn tls_files(&self, file: &FileSettings) -> anyhow::Result<Option<TlsFiles>> {
        let path_origin = |field: &str, given: &Option<PathBuf>| {
            self.origin(field, given.as_ref().map(|p| p.display().to_string()))
        };
        let tls = match (
            pick!(self, file, tls_cert),
            pick!(self, file, tls_key),
            pick!(self, file, tls_client_ca),
        ) {
            (None, None, None) => None,
            (Some(cert), Some(key), client_ca) => Some(TlsFiles {
                cert,
                key,
                client_ca,
            }),
            (Some(_), None, _) => bail!(
                "{} needs a private key: set --tls-key (FERRYMQ_TLS_KEY) too",
                path_origin("tls_cert", &self.tls_cert)
            ),
            (None, Some(_), _) => bail!(
                "{} needs a certificate: set --tls-cert (FERRYMQ_TLS_CERT) too",
                path_origin("tls_key", &self.tls_key)
            ),
            (None, None, Some(_)) => bail!(
                "{} (mutual TLS) needs TLS: set --tls-cert and --tls-key too",
                path_origin("tls_client_ca", &self.tls_client_ca)
            ),
        };
        Ok(tls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_and_the_file_overrides_defaults() {
        let dir = std::env::temp_dir().join(format!("ferrymq-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ferrymq.toml");
        std::fs::write(
            &path,
            "tcp_addr = \"127.0.0.1:9001\"\nmessage_max_bytes = 1000\nlog = \"debug\"\nstatus_history = 7\n",
        )
        .unwrap();
        let settings = Settings {
            config: Some(path.clone()),
            tcp_addr: Some("127.0.0.1:9002".parse().unwrap()),
            ..Default::default()
        };
        let resolved = settings.resolve().unwrap();
        assert_eq!(resolved.server.tcp_addr, "127.0.0.1:9002".parse().unwrap());
        assert_eq!(resolved.server.broker.message_body_bytes_max, 1000);
        assert_eq!(resolved.log, "debug");
        assert_eq!(resolved.server.broker.status_history, 7);
        assert_eq!(resolved.server.http_addr, ServerConfig::default().http_addr);
        let too_many = Settings {
            status_history: Some(STATUS_HISTORY_MAX + 1),
            ..Default::default()
        };
        assert!(too_many.resolve().is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn cluster_of(settings: Settings) -> anyhow::Result<ClusterSettings> {
        Ok(settings.resolve()?.cluster.unwrap())
    }

    #[test]
    fn peers_may_be_host_names_and_clients_are_told_a_reachable_address() {
        // In a container: listening on every interface, the peers named as their services.
        let container = |advertise: Option<&str>| Settings {
            node_id: Some(2),
            cluster_addr: Some("0.0.0.0:7090".parse().unwrap()),
            peers: Some("1=node1:7090, 2=node2:7090,3=node3:7090".into()),
            tcp_addr: Some("0.0.0.0:7070".parse().unwrap()),
            advertise_addr: advertise.map(str::to_owned),
            insecure: true,
            ..Default::default()
        };
        let cluster = cluster_of(container(None)).unwrap();
        assert_eq!(cluster.peers[&1], "node1:7090");
        assert_eq!(cluster.peers[&3], "node3:7090");
        assert_eq!(cluster.client_addr, "node2:7070");
        let told = cluster_of(container(Some("broker-2.example.com:17070"))).unwrap();
        assert_eq!(told.client_addr, "broker-2.example.com:17070");
        let error = cluster_of(container(Some("broker-2"))).err().unwrap();
        assert!(
            format!("{error:#}").contains("--advertise-addr: 'broker-2' is not HOST:PORT"),
            "{error:#}"
        );

        // On a host with its own address, that address is the clients'.
        let host = Settings {
            node_id: Some(1),
            cluster_addr: Some("127.0.0.1:7090".parse().unwrap()),
            peers: Some("1=127.0.0.1:7090,2=localhost:7091".into()),
            tcp_addr: Some("127.0.0.1:7070".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(cluster_of(host).unwrap().client_addr, "127.0.0.1:7070");
        let v6 = Settings {
            node_id: Some(1),
            cluster_addr: Some("[::]:7090".parse().unwrap()),
            peers: Some("1=[fd00::1]:7090,2=[fd00::2]:7090".into()),
            tcp_addr: Some("[::]:7070".parse().unwrap()),
            insecure: true,
            ..Default::default()
        };
        assert!(
            cluster_of(v6).is_err(),
            "an IP peer address must be the listener's own"
        );

        let bad = Settings {
            node_id: Some(1),
            cluster_addr: Some("127.0.0.1:7090".parse().unwrap()),
            peers: Some("1=127.0.0.1:7090,2=node2".into()),
            ..Default::default()
        };
        let error = cluster_of(bad).err().unwrap();
        assert!(
            format!("{error:#}").contains("'node2' is not HOST:PORT (in '2=node2')"),
            "{error:#}"
        );
    }

    /// deploy/ferrymq.toml promises every setting with its default: it must parse, resolve to
    /// exactly what no settings at all resolve to, and name every flag of `serve`.
    #[test]
    fn the_sample_config_lists_every_setting_with_its_default() {
        let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/ferrymq.toml");
        let from_sample = Settings {
            config: Some(sample.clone()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        let defaults = Settings::default().resolve().unwrap();
        assert_eq!(
            format!("{:?}", from_sample.server),
            format!("{:?}", defaults.server)
        );
        assert_eq!(from_sample.segment_bytes, defaults.segment_bytes);
        assert_eq!(from_sample.worker_threads, defaults.worker_threads);
        assert_eq!(from_sample.log, defaults.log);
        assert_eq!(from_sample.insecure, defaults.insecure);
        assert_eq!(from_sample.session_lifetime, defaults.session_lifetime);
        assert_eq!(from_sample.tls, defaults.tls);

        let text = std::fs::read_to_string(&sample).unwrap();
        let command = <Settings as clap::Args>::augment_args(clap::Command::new("serve"));
        for arg in command.get_arguments() {
            let key = arg.get_id().as_str();
            if key == "config" {
                continue;
            }
            let listed = text.lines().any(|line| {
                let line = line.trim_start_matches(['#', ' ']);
                line.starts_with(key) && line[key.len()..].trim_start().starts_with('=')
            });
            assert!(listed, "deploy/ferrymq.toml does not list `{key}`");
        }
    }

    #[test]
    fn a_session_lifetime_out_of_bounds_names_its_setting() {
        for ms in [999, SESSION_LIFETIME_MS_MAX + 1] {
            let error = Settings {
                session_lifetime_ms: Some(ms),
                ..Default::default()
            }
            .resolve()
            .err()
            .unwrap()
            .to_string();
            assert!(error.contains("--session-lifetime-ms"), "{error}");
        }
        let resolved = Settings {
            session_lifetime_ms: Some(60_000),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(
            resolved.session_lifetime,
            std::time::Duration::from_secs(60)
        );
    }

    #[test]
    fn unknown_keys_in_the_file_are_an_error() {
        let dir = std::env::temp_dir().join(format!(
            "ferrymq-config-test-unknown-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ferrymq.toml");
        std::fs::write(&path, "tcp_adr = \"127.0.0.1:9001\"\n").unwrap();
        let error = Settings {
            config: Some(path),
            ..Default::default()
        }
        .resolve()
        .err()
        .unwrap();
        assert!(format!("{error:#}").contains("tcp_adr"), "{error:#}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
