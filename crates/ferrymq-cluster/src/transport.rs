//! The node-level transport: one connection per peer carries the Raft traffic of every group.
//!
//! A Raft instance never talks to the network itself. Its [`crate::network::GroupNetwork`] wraps
//! each RPC in an [`Envelope`] naming the group and hands it to the node's one [`Transport`];
//! the receiving node's [`GroupRouter`] hands it to that group's Raft instance. So a node with a
//! thousand partition groups still has one connection per peer, and a transport may put many
//! groups' envelopes (heartbeats above all) into one frame.
//!
//! Invariants of a [`Transport`]:
//! - `call` returns within `timeout`; a message lost on the way (either direction) is a
//!   [`TransportError::Timeout`] after that time, as it would be on a real network; a transport
//!   that knows the peer cannot be reached (no connection, connection lost, refused) may say so
//!   earlier with [`TransportError::Unreachable`] or [`TransportError::Refused`];
//! - a reply is the receiving group's own answer, never made up by the transport;
//! - queues are bounded: a full queue is [`TransportError::QueueFull`], never unbounded growth.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::types::{GroupId, NodeId, Raft, TypeConfig};

/// A Raft RPC of one group.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRpc {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A client's request a node passes to the node that can answer it (a partition's leader,
    /// the metadata group's leader), opaque here and handed to the receiving node's
    /// [`ForwardHandler`]; the envelope's group is not used.
    Forward(Vec<u8>),
}

/// The answer of the receiving group's Raft instance.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftReply {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    /// The receiving node's answer to a forwarded request, or why it has none.
    Forward(Result<Vec<u8>, String>),
}

/// What a forwarded request's answer is computed by.
pub type ForwardFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send>>;

/// Answers the requests other nodes forward to this one ([`RaftRpc::Forward`]). The cluster
/// carries them between nodes and knows nothing of what they mean.
pub trait ForwardHandler: Send + Sync + 'static {
    /// Answers `request`, forwarded by node `from`.
    fn handle(&self, from: NodeId, request: Vec<u8>) -> ForwardFuture;
}

/// One RPC on the wire: which group, from which node, to which node.
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope {
    pub group: GroupId,
    pub from: NodeId,
    pub to: NodeId,
    pub rpc: RaftRpc,
}

/// Why an RPC got no answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum TransportError {
    #[error("no reply from node {node} within {timeout_ms} ms")]
    Timeout { node: NodeId, timeout_ms: u64 },
    #[error("the queue to node {node} is full")]
    QueueFull { node: NodeId },
    #[error("node {node} runs no group {group}")]
    NoSuchGroup { node: NodeId, group: GroupId },
    #[error("the reply did not match the request")]
    UnexpectedReply,
    #[error("node {node} is unreachable: {reason}")]
    Unreachable { node: NodeId, reason: String },
    #[error("node {node} refused the connection: {reason}")]
    Refused { node: NodeId, reason: String },
    #[error("a message of {bytes} bytes to node {node} exceeds the frame limit of {limit}")]
    FrameTooLarge {
        node: NodeId,
        bytes: u64,
        limit: u64,
    },
}

/// Sends one node's envelopes to its peers.
pub trait Transport: Clone + Send + Sync + 'static {
    /// The node this transport sends from.
    fn local_node(&self) -> NodeId;

    /// Sends `envelope` and waits at most `timeout` for the reply.
    fn call(
        &self,
        envelope: Envelope,
        timeout: Duration,
    ) -> impl Future<Output = Result<RaftReply, TransportError>> + Send;
}

/// The receiving side: the Raft instances a node runs, by group.
#[derive(Default)]
pub struct GroupRouter {
    groups: RwLock<BTreeMap<GroupId, Raft>>,
    forward: RwLock<Option<Arc<dyn ForwardHandler>>>,
    /// The highest index each group's leader has said is committed (its `leader_commit`), since
    /// this process started: what this node's replica has to apply to be caught up.
    /// `Some(None)`: a leader was heard, with nothing committed yet.
    leader_commits: RwLock<BTreeMap<GroupId, Option<u64>>>,
}

impl std::fmt::Debug for GroupRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupRouter")
            .field("groups", &self.group_ids())
            .finish()
    }
}

impl GroupRouter {
    /// Routes `group`'s envelopes to `raft` from now on.
    pub fn insert(&self, group: GroupId, raft: Raft) {
        self.groups.write().insert(group, raft);
    }

    /// Stops routing to `group`, handing back its Raft instance.
    pub fn remove(&self, group: GroupId) -> Option<Raft> {
        self.leader_commits.write().remove(&group);
        self.groups.write().remove(&group)
    }

    /// The highest log index a leader of `group` has told this node is committed since this
    /// process started: `None` until a leader's AppendEntries (a heartbeat too) has arrived,
    /// `Some(None)` when it had committed nothing. Every leader's commit index, a deposed
    /// one's too, names an entry that stays committed, so this is a lower bound of the group's
    /// commit index.
    pub fn leader_commit(&self, group: GroupId) -> Option<Option<u64>> {
        self.leader_commits.read().get(&group).copied()
    }

    /// The Raft instance of `group`, if this node runs it.
    pub fn get(&self, group: GroupId) -> Option<Raft> {
        self.groups.read().get(&group).cloned()
    }

    /// The groups this node runs.
    pub fn group_ids(&self) -> Vec<GroupId> {
        self.groups.read().keys().copied().collect()
    }

    /// Answers forwarded requests with `handler` from now on; until then they are refused.
    pub fn set_forward_handler(&self, handler: Arc<dyn ForwardHandler>) {
        *self.forward.write() = Some(handler);
    }

    /// Hands an incoming envelope to its group and returns the group's answer.
    pub async fn dispatch(&self, envelope: Envelope) -> Result<RaftReply, TransportError> {
        if let RaftRpc::Forward(request) = envelope.rpc {
            let handler = self.forward.read().clone();
            let answer = match handler {
                Some(handler) => handler.handle(envelope.from, request).await,
                None => Err(format!(
                    "node {} is starting and answers no forwarded request yet",
                    envelope.to
                )),
            };
            return Ok(RaftReply::Forward(answer));
        }
        let raft = self
            .get(envelope.group)
            .ok_or(TransportError::NoSuchGroup {
                node: envelope.to,
                group: envelope.group,
            })?;
        Ok(match envelope.rpc {
            RaftRpc::AppendEntries(req) => {
                let committed = req.leader_commit.map(|id| id.index);
                self.leader_commits
                    .write()
                    .entry(envelope.group)
                    .and_modify(|known| *known = (*known).max(committed))
                    .or_insert(committed);
                RaftReply::AppendEntries(raft.append_entries(req).await)
            }
            RaftRpc::Vote(req) => RaftReply::Vote(raft.vote(req).await),
            RaftRpc::InstallSnapshot(req) => {
                RaftReply::InstallSnapshot(raft.install_snapshot(req).await)
            }
            RaftRpc::Forward(_) => unreachable!("answered above"),
        })
    }
}

/// A shared [`GroupRouter`].
pub type SharedRouter = Arc<GroupRouter>;
