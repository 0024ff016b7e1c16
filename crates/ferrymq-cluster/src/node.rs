//! One cluster node: many Raft groups over one transport.
//!
//! A [`ClusterNode`] starts and stops groups by [`GroupId`], each with its own
//! [`GroupStorage`]; all of them share the node's [`Transport`] for sending and its
//! [`GroupRouter`] for receiving. Writes and reads go to the Raft instance of the group named.
//!
//! What is acknowledged when: [`ClusterNode::write`] returns `Ok` only once the entry is committed
//! by a majority of the group and applied on this node, which must be the group's leader. Any
//! error means the write may or may not be committed; a client that retries may write twice.
//! [`ClusterNode::read_metadata`] is linearizable: it confirms leadership with a majority and
//! waits until everything committed before the read is applied.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, Config, EmptyNode, RaftMetrics, ServerState, SnapshotPolicy};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::metadata::MetadataState;
use crate::network::GroupNetworkFactory;
use crate::storage::{GroupData, GroupStorage};
use crate::transport::{
    Envelope, GroupRouter, RaftReply, RaftRpc, SharedRouter, Transport, TransportError,
};
use crate::types::{GroupId, LogId, NodeId, Raft, Request, Response};

/// A learner within this many entries of its leader's log counts as caught up: it becomes a
/// voter (and the entries left reach it with the change).
const CATCH_UP_ENTRIES: u64 = 64;

/// Raft timing of every group on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupTiming {
    /// How often a leader sends heartbeats.
    pub heartbeat_interval_ms: u64,
    /// Election timeouts are drawn from `election_timeout_min_ms..election_timeout_max_ms`.
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// The longest one Raft RPC may wait for its reply.
    pub rpc_timeout_ms: u64,
    /// A group that compacts (see [`crate::storage::GroupStateMachine::compacts`]) takes a
    /// snapshot after this many entries and purges its Raft log below it.
    pub snapshot_every: u64,
    /// How many entries below a snapshot a group keeps, so that a replica a little behind
    /// catches up from the log instead of a snapshot.
    pub entries_kept: u64,
}

impl Default for GroupTiming {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 50,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 600,
            rpc_timeout_ms: 200,
            snapshot_every: 8192,
            entries_kept: 1024,
        }
    }
}

impl GroupTiming {
    /// openraft's `heartbeat_interval` for `group` on `node`. The node sends heartbeats on its
    /// own clock (`heartbeat_interval_ms`); openraft uses this value only as its AppendEntries
    /// timeout and, times 1.5, as the tick on which a follower checks its election timeout.
    /// Each candidate's timeout is drawn once per Raft instance, so two nodes whose timeouts
    /// round to the same number of ticks, after a split vote, stand again in the same instant
    /// round after round. A per-node offset (up to half the interval, and below
    /// `election_timeout_min_ms`) gives every node a tick of its own: their next attempts drift
    /// apart by at least a few milliseconds per round and one of them wins. Deterministic, so a
    /// simulated history still replays from its seed.
    fn raft_heartbeat_ms(&self, node: NodeId, group: GroupId) -> u64 {
        let room = (self.heartbeat_interval_ms / 2).min(
            self.election_timeout_min_ms
                .saturating_sub(self.heartbeat_interval_ms + 1),
        );
        if room == 0 {
            return self.heartbeat_interval_ms;
        }
        let spread = node
            .wrapping_mul(0x9E37_79B9)
            .wrapping_add(group.0.wrapping_mul(31));
        self.heartbeat_interval_ms + spread % (room + 1)
    }

    fn raft_config(
        &self,
        node: NodeId,
        group: GroupId,
        compacts: bool,
    ) -> Result<Config, ClusterError> {
        let snapshot_policy = if compacts {
            SnapshotPolicy::LogsSinceLast(self.snapshot_every.max(1))
        } else {
            // The state lives only in memory and is rebuilt from the whole log.
            SnapshotPolicy::Never
        };
        Config {
            cluster_name: format!("ferrymq-{group}"),
            heartbeat_interval: self.raft_heartbeat_ms(node, group),
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            snapshot_policy,
            max_in_snapshot_log_to_keep: self.entries_kept,
            // The node sends every group's heartbeats at once (see `spawn_heartbeats`), so they
            // leave together and share frames instead of each group keeping its own clock.
            enable_heartbeat: false,
            ..Default::default()
        }
        .validate()
        .map_err(|e| ClusterError::Config(e.to_string()))
    }
}

/// Why a node could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error("group {0} does not run on this node")]
    NoSuchGroup(GroupId),
    #[error("group {0} already runs on this node")]
    GroupRunning(GroupId),
    #[error("not the leader of group {group}; the leader is {leader:?}")]
    NotLeader {
        group: GroupId,
        leader: Option<NodeId>,
    },
    #[error("no answer within {timeout_ms} ms; the write may or may not be committed")]
    Timeout { timeout_ms: u64 },
    #[error("invalid Raft configuration: {0}")]
    Config(String),
    #[error("group {0} is not a metadata group")]
    NotMetadata(GroupId),
    #[error("Raft: {0}")]
    Raft(String),
}

struct RunningGroup {
    raft: Raft,
    storage: GroupStorage,
}

/// A node of the cluster.
pub struct ClusterNode<T> {
    id: NodeId,
    transport: T,
    router: SharedRouter,
    timing: GroupTiming,
    groups: Mutex<BTreeMap<GroupId, RunningGroup>>,
}

impl<T: Transport> ClusterNode<T> {
    /// A node sending over `transport`; its peers' transports deliver to [`Self::router`].
    pub fn new(transport: T, timing: GroupTiming) -> Self {
        Self {
            id: transport.local_node(),
            transport,
            router: Arc::new(GroupRouter::default()),
            timing,
            groups: Mutex::new(BTreeMap::new()),
        }
    }

    /// Starts the node's heartbeat clock: every `heartbeat_interval_ms` each group led here
    /// sends its heartbeats, all in the same instant, so the transport can put the heartbeats
    /// of many groups to one peer into one frame. Without it leaders send no heartbeats and
    /// followers start elections. The task ends once the node is dropped.
    pub fn spawn_heartbeats(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let node = Arc::downgrade(self);
        let period = Duration::from_millis(self.timing.heartbeat_interval_ms);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(node) = node.upgrade() else { break };
                let leading: Vec<Raft> = node
                    .groups
                    .lock()
                    .values()
                    .filter(|g| g.raft.metrics().borrow().state == ServerState::Leader)
                    .map(|g| g.raft.clone())
                    .collect();
                drop(node);
                for raft in leading {
                    // Only fails when the group is shutting down; nothing to heartbeat then.
                    let _ = raft.trigger().heartbeat().await;
                }
            }
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The transport the node sends over.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Where incoming envelopes for this node's groups go.
    pub fn router(&self) -> SharedRouter {
        self.router.clone()
    }

    /// Starts `group` over `storage` (empty for a new replica, kept for a restart).
    pub async fn start_group(
        &self,
        group: GroupId,
        storage: GroupStorage,
    ) -> Result<Raft, ClusterError> {
        if self.groups.lock().contains_key(&group) {
            return Err(ClusterError::GroupRunning(group));
        }
        let compacts = storage.state.compacts();
        let config = Arc::new(self.timing.raft_config(self.id, group, compacts)?);
        let network = GroupNetworkFactory::new(
            group,
            self.transport.clone(),
            Duration::from_millis(self.timing.rpc_timeout_ms),
        );
        let raft = Raft::new(
            self.id,
            config,
            network,
            storage.log.clone(),
            storage.state.clone(),
        )
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))?;
        let raced = {
            let mut groups = self.groups.lock();
            let raced = groups.contains_key(&group);
            if !raced {
                self.router.insert(group, raft.clone());
                let running = RunningGroup {
                    raft: raft.clone(),
                    storage,
                };
                groups.insert(group, running);
            }
            raced
        };
        if raced {
            // Another start of the same group won; this instance must not keep running.
            let _ = raft.shutdown().await;
            return Err(ClusterError::GroupRunning(group));
        }
        Ok(raft)
    }

    /// Makes this node's replica of a new `group` propose the first membership: `voters`.
    pub async fn initialize(
        &self,
        group: GroupId,
        voters: &BTreeSet<NodeId>,
    ) -> Result<(), ClusterError> {
        let raft = self.raft(group)?;
        let members: BTreeMap<NodeId, EmptyNode> =
            voters.iter().map(|&n| (n, EmptyNode {})).collect();
        raft.initialize(members)
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))
    }

    /// Stops `group` here, handing back its storage.
    pub async fn stop_group(&self, group: GroupId) -> Result<GroupStorage, ClusterError> {
        self.router.remove(group);
        let running = self
            .groups
            .lock()
            .remove(&group)
            .ok_or(ClusterError::NoSuchGroup(group))?;
        if let Err(e) = running.raft.shutdown().await {
            // The Raft task ended abnormally (it panicked); what it stored is still the group's.
            tracing::warn!(%group, error = %e, "group stopped abnormally");
        }
        Ok(running.storage)
    }

    /// Stops every group, handing back their storage.
    pub async fn shutdown(&self) -> BTreeMap<GroupId, GroupStorage> {
        let ids: Vec<GroupId> = self.groups.lock().keys().copied().collect();
        let mut stored = BTreeMap::new();
        for group in ids {
            if let Ok(storage) = self.stop_group(group).await {
                stored.insert(group, storage);
            }
        }
        stored
    }

    /// The groups running here.
    pub fn group_ids(&self) -> Vec<GroupId> {
        self.groups.lock().keys().copied().collect()
    }

    /// The Raft instance of `group`.
    pub fn raft(&self, group: GroupId) -> Result<Raft, ClusterError> {
        self.groups
            .lock()
            .get(&group)
            .map(|g| g.raft.clone())
            .ok_or(ClusterError::NoSuchGroup(group))
    }

    /// The storage of `group` on this node.
    pub fn storage(&self, group: GroupId) -> Result<GroupStorage, ClusterError> {
        self.groups
            .lock()
            .get(&group)
            .map(|g| g.storage.clone())
            .ok_or(ClusterError::NoSuchGroup(group))
    }

    /// `group`'s Raft metrics on this node: state, term, leader, applied position.
    pub fn metrics(
        &self,
        group: GroupId,
    ) -> Result<watch::Receiver<RaftMetrics<NodeId, EmptyNode>>, ClusterError> {
        Ok(self.raft(group)?.metrics())
    }

    /// Proposes `request` to `group`, which must be led from this node. `Ok` means committed and
    /// applied: the acknowledgement point. Gives up after `timeout`.
    pub async fn write(
        &self,
        group: GroupId,
        request: Request,
        timeout: Duration,
    ) -> Result<(LogId, Response), ClusterError> {
        let raft = self.raft(group)?;
        let written = tokio::time::timeout(timeout, raft.client_write(request))
            .await
            .map_err(|_| ClusterError::Timeout {
                timeout_ms: timeout.as_millis() as u64,
            })?;
        match written {
            Ok(resp) => Ok((resp.log_id, resp.data)),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(ClusterError::NotLeader {
                    group,
                    leader: f.leader_id,
                })
            }
            Err(e) => Err(ClusterError::Raft(e.to_string())),
        }
    }

    /// The voters of `group` as this node last applied its membership.
    pub fn voters(&self, group: GroupId) -> Result<BTreeSet<NodeId>, ClusterError> {
        let metrics = self.metrics(group)?;
        let voters = metrics
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        Ok(voters)
    }

    /// One step towards `group`, led here, having exactly `voters`: a new voter is added as a
    /// learner first and made a voter only once it has caught up (from the log, or a snapshot),
    /// so the group never counts on a replica that holds nothing yet; a voter left out is
    /// removed in the same change. `Ok(true)` once the voters are `voters`; `Ok(false)` while
    /// a step is still under way (or this node does not lead `group`): call again.
    pub async fn move_voters(
        &self,
        group: GroupId,
        voters: &BTreeSet<NodeId>,
        timeout: Duration,
    ) -> Result<bool, ClusterError> {
        if voters.is_empty() {
            return Err(ClusterError::Config(format!(
                "{group} cannot be left without voters"
            )));
        }
        let raft = self.raft(group)?;
        let metrics = raft.metrics().borrow().clone();
        if metrics.state != ServerState::Leader {
            return Ok(false);
        }
        let membership = metrics.membership_config.membership();
        let current: BTreeSet<NodeId> = membership.voter_ids().collect();
        let known: BTreeSet<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
        let raft_error = |e: String| ClusterError::Raft(e);
        let timed_out = || ClusterError::Timeout {
            timeout_ms: timeout.as_millis() as u64,
        };
        if &current == voters {
            let stray: BTreeSet<NodeId> = known.difference(voters).copied().collect();
            if stray.is_empty() {
                return Ok(true);
            }
            // A learner added for a node that was removed again before it caught up.
            tokio::time::timeout(
                timeout,
                raft.change_membership(ChangeMembers::RemoveNodes(stray), false),
            )
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| raft_error(e.to_string()))?;
            return Ok(true);
        }
        for &node in voters.difference(&known) {
            tokio::time::timeout(timeout, raft.add_learner(node, EmptyNode {}, false))
                .await
                .map_err(|_| timed_out())?
                .map_err(|e| raft_error(e.to_string()))?;
        }
        let last = metrics.last_log_index.unwrap_or(0);
        let matched = |node: &NodeId| {
            metrics
                .replication
                .as_ref()
                .and_then(|r| r.get(node).copied().flatten())
                .map(|id| id.index)
        };
        let behind = voters
            .difference(&current)
            .any(|n| matched(n).map_or(true, |m| m + CATCH_UP_ENTRIES < last));
        if behind {
            return Ok(false);
        }
        tokio::time::timeout(timeout, raft.change_membership(voters.clone(), false))
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| raft_error(e.to_string()))?;
        Ok(false)
    }

    /// Hands `request` to `group`, led here, and returns at once with the wait for its outcome
    /// (as [`Self::write`] gives it): requests handed over one after another are entries in
    /// that order, however their waits are then awaited.
    pub async fn write_in_order(
        &self,
        group: GroupId,
        request: Request,
    ) -> Result<
        impl std::future::Future<Output = Result<(LogId, Response), ClusterError>> + Send + 'static,
        ClusterError,
    > {
        let raft = self.raft(group)?;
        let answer = raft
            .client_write_ff(request)
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        Ok(async move {
            match answer.await {
                Ok(Ok(resp)) => Ok((resp.log_id, resp.data)),
                Ok(Err(ClientWriteError::ForwardToLeader(f))) => Err(ClusterError::NotLeader {
                    group,
                    leader: f.leader_id,
                }),
                Ok(Err(e)) => Err(ClusterError::Raft(e.to_string())),
                Err(_) => Err(ClusterError::Raft(format!(
                    "{group} stopped before it answered; the write may or may not be committed"
                ))),
            }
        })
    }

    /// Sends `request` to node `to` for its [`ForwardHandler`](crate::transport::ForwardHandler)
    /// and waits at most `timeout` for the answer. The outer error means no answer came (the
    /// request may or may not have been carried out there); the inner one is the handler's.
    pub async fn forward(
        &self,
        to: NodeId,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Result<Vec<u8>, String>, TransportError> {
        let envelope = Envelope {
            group: GroupId::METADATA,
            from: self.id,
            to,
            rpc: RaftRpc::Forward(request),
        };
        match self.transport.call(envelope, timeout).await? {
            RaftReply::Forward(answer) => Ok(answer),
            _ => Err(TransportError::UnexpectedReply),
        }
    }

    /// A linearizable read of the metadata held by `group`: it sees every write acknowledged
    /// before it started. Must run on the leader; gives up after `timeout`.
    pub async fn read_metadata<R>(
        &self,
        group: GroupId,
        timeout: Duration,
        read: impl FnOnce(&MetadataState) -> R,
    ) -> Result<R, ClusterError> {
        let running = {
            let groups = self.groups.lock();
            let g = groups.get(&group).ok_or(ClusterError::NoSuchGroup(group))?;
            (g.raft.clone(), g.storage.clone())
        };
        let (raft, storage) = running;
        let confirmed = tokio::time::timeout(timeout, raft.ensure_linearizable())
            .await
            .map_err(|_| ClusterError::Timeout {
                timeout_ms: timeout.as_millis() as u64,
            })?;
        if let Err(e) = confirmed {
            return Err(match e.forward_to_leader() {
                Some(f) => ClusterError::NotLeader {
                    group,
                    leader: f.leader_id,
                },
                None => ClusterError::Raft(e.to_string()),
            });
        }
        storage.state.read(|data| match data {
            GroupData::Metadata(m) => Ok(read(m)),
            GroupData::Partition(_) => Err(ClusterError::NotMetadata(group)),
        })
    }
}
