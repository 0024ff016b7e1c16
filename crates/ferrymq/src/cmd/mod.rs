//! `ferrymq pub | sub | topic | stats | status | subscription | dead | cluster | connection`: thin
//! commands over the
//! Rust client, one command per file.
//!
//! Each command builds a small single-threaded runtime, connects, does its work and closes the
//! connection. Output meant for people goes to stdout as text or tables; `--json` (or
//! `--format json`) prints machine-readable JSON instead. Every wait is bounded: requests by the
//! client's request timeout, `sub` by `--count`, `--timeout` or Ctrl-C.
//!
//! The shared pieces: `connect` (flags, credentials, runtime), `args` (values several commands
//! parse), `output` (tables, times, bytes, entries as JSON) and `http` (the one HTTP request).
//! A command's file imports those and nothing from another command's file.

mod args;
mod cluster;
mod connect;
mod connection;
mod dead;
mod http;
mod output;
mod publish;
mod stats;
mod status;
mod subscribe;
mod subscription;
mod topic;

pub use args::parse_duration;
pub use cluster::{run_cluster, ClusterArgs};
pub use connect::{ConnectArgs, TlsArgs};
pub use connection::{run_connection, ConnectionArgs};
pub use dead::{run_dead, DeadArgs};
pub(crate) use http::http_get;
pub(crate) use output::time_text;
pub use publish::{run_pub, PubArgs};
pub use stats::{run_stats, StatsArgs};
pub use status::{run_status, StatusArgs};
pub use subscribe::{run_sub, SubArgs};
pub use subscription::{run_subscription, SubscriptionArgs};
pub use topic::{run_topic, StorageArg, TopicArgs};
