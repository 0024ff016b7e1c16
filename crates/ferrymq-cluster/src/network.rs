//! openraft's network, per group, over the node's shared [`Transport`].
//!
//! [`GroupNetworkFactory`] is what one group's Raft instance is built with; every client it makes
//! stamps the group's id on each RPC and sends it over the same transport as every other group.

use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{Backoff, RPCOption};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{EmptyNode, RPCTypes, RaftNetwork, RaftNetworkFactory};

use crate::transport::{Envelope, RaftReply, RaftRpc, Transport, TransportError};
use crate::types::{GroupId, NodeId, TypeConfig};

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<NodeId, EmptyNode, RaftError<NodeId, E>>>;

/// Builds the per-peer clients of one group.
#[derive(Debug, Clone)]
pub struct GroupNetworkFactory<T> {
    group: GroupId,
    transport: T,
    rpc_timeout: Duration,
}

impl<T: Transport> GroupNetworkFactory<T> {
    /// Clients of `group` over `transport`; no RPC waits longer than `rpc_timeout`.
    pub fn new(group: GroupId, transport: T, rpc_timeout: Duration) -> Self {
        Self {
            group,
            transport,
            rpc_timeout,
        }
    }
}

impl<T: Transport> RaftNetworkFactory<TypeConfig> for GroupNetworkFactory<T> {
    type Network = GroupNetwork<T>;

    async fn new_client(&mut self, target: NodeId, _node: &EmptyNode) -> Self::Network {
        GroupNetwork {
            group: self.group,
            target,
            transport: self.transport.clone(),
            rpc_timeout: self.rpc_timeout,
        }
    }
}

/// One group's client to one peer.
#[derive(Debug)]
pub struct GroupNetwork<T> {
    group: GroupId,
    target: NodeId,
    transport: T,
    rpc_timeout: Duration,
}

impl<T: Transport> GroupNetwork<T> {
    async fn call<E: std::error::Error>(
        &self,
        rpc: RaftRpc,
        action: RPCTypes,
        option: &RPCOption,
    ) -> Result<RaftReply, RPCError<NodeId, EmptyNode, RaftError<NodeId, E>>> {
        let timeout = option.hard_ttl().min(self.rpc_timeout);
        let entries = match &rpc {
            RaftRpc::AppendEntries(req) => req.entries.len() as u64,
            _ => 0,
        };
        let envelope = Envelope {
            group: self.group,
            from: self.transport.local_node(),
            to: self.target,
            rpc,
        };
        match self.transport.call(envelope, timeout).await {
            Ok(reply) => Ok(reply),
            Err(TransportError::Timeout { .. }) => Err(RPCError::Timeout(Timeout {
                action,
                id: self.transport.local_node(),
                target: self.target,
                timeout,
            })),
            // Too many entries for one frame: openraft retries with fewer.
            Err(TransportError::FrameTooLarge { .. }) if entries > 1 => Err(
                RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(entries / 2)),
            ),
            // A peer that is down or refuses us: openraft backs off before trying it again,
            // rather than retrying at once in a loop that would take a core.
            Err(e @ (TransportError::Unreachable { .. } | TransportError::Refused { .. })) => {
                Err(RPCError::Unreachable(Unreachable::new(&e)))
            }
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }

    fn remote<E: std::error::Error>(
        &self,
        e: RaftError<NodeId, E>,
    ) -> RPCError<NodeId, EmptyNode, RaftError<NodeId, E>> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }
}

fn unexpected<E: std::error::Error>() -> RPCError<NodeId, EmptyNode, RaftError<NodeId, E>> {
    RPCError::Network(NetworkError::new(&TransportError::UnexpectedReply))
}

/// The first wait before a group's replication retries a peer it could not reach.
const UNREACHABLE_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// The longest such wait (openraft's own constant one).
const UNREACHABLE_BACKOFF_MAX: Duration = Duration::from_millis(500);

impl<T: Transport> RaftNetwork<TypeConfig> for GroupNetwork<T> {
    /// After [`RPCError::Unreachable`] a replication stream waits before it tries the peer again:
    /// 50 ms, doubling up to 500 ms, from the first failure until an RPC succeeds. openraft's
    /// default waits 500 ms every time, so a follower that has just restarted (and that the
    /// transport reconnects to as soon as it calls in) went unreplicated for up to half a second
    /// and could still be behind when the next failover needed its vote.
    fn backoff(&self) -> Backoff {
        let waits = std::iter::successors(Some(UNREACHABLE_BACKOFF_MIN), |d| {
            Some((*d * 2).min(UNREACHABLE_BACKOFF_MAX))
        });
        Backoff::new(waits)
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        let reply = self
            .call(
                RaftRpc::AppendEntries(rpc),
                RPCTypes::AppendEntries,
                &option,
            )
            .await?;
        match reply {
            RaftReply::AppendEntries(r) => r.map_err(|e| self.remote(e)),
            _ => Err(unexpected()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        let reply = self
            .call(
                RaftRpc::InstallSnapshot(rpc),
                RPCTypes::InstallSnapshot,
                &option,
            )
            .await?;
        match reply {
            RaftReply::InstallSnapshot(r) => r.map_err(|e| self.remote(e)),
            _ => Err(unexpected()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        let reply = self
            .call(RaftRpc::Vote(rpc), RPCTypes::Vote, &option)
            .await?;
        match reply {
            RaftReply::Vote(r) => r.map_err(|e| self.remote(e)),
            _ => Err(unexpected()),
        }
    }
}
