//! FerryMQ's replication core: Raft groups on openraft.
//!
//! - [`ids`], [`types`]: [`GroupId`] (0 = metadata, others = partitions) and the one Raft type
//!   configuration every group shares.
//! - [`metadata`]: the metadata state machine (members, topics, placement).
//! - [`partition`]: the partition state machine (record batches to offsets) and the
//!   [`partition::PartitionLog`] seam for the broker's durable log.
//! - [`storage`]: the Raft log of a group and the group state machine; [`durable`]: the
//!   Raft log on disk (redb).
//! - [`transport`], [`network`]: one node-level transport carrying every group's RPCs;
//!   [`tcp`]: that transport over TCP, one connection per peer.
//! - [`node`]: a node running many groups.
//! - [`inproc`]: an in-process transport with seeded faults, for the simulation.
//! - [`runtime`]: tokio with a seedable random source, so elections replay.
//!
//! The broker does not depend on this crate; it is the replication core, not yet wired in.

pub mod durable;
pub mod ids;
pub mod inproc;
pub mod metadata;
pub mod network;
pub mod node;
pub mod partition;
pub mod runtime;
pub mod storage;
pub mod tcp;
pub mod transport;
pub mod types;

pub use node::{ClusterError, ClusterNode, GroupTiming};
/// A node's role in a group, as its metrics report it.
pub use openraft::ServerState;
pub use types::{GroupId, NodeId, Request, Response, TypeConfig};
