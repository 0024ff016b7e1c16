//! The cluster's users: every change to a user is committed by the metadata group
//! ([`ClusterUsers`], the broker's [`UserReplicator`]) and every node takes the metadata's users
//! in place of its own ([`Cluster::follow_users`]).
//!
//! Until the first change, the metadata holds no users and each node keeps its own (as a node
//! started with `--admin-password-file` bootstraps its admin); the metadata leader then writes
//! its own users to the metadata, and from then on the metadata's are every node's. A node whose
//! users differed (another admin password) takes the cluster's.

use std::sync::Weak;

use ferrymq_broker::auth::UserReplicator;
use ferrymq_broker::BrokerError;
use ferrymq_cluster::metadata::{MetaCommand, MetaOutcome, MetadataState};
use ferrymq_cluster::GroupId;

use super::forward::Forwarded;
use super::Cluster;

/// Commits changes to users through the metadata group's leader.
pub(super) struct ClusterUsers {
    pub(super) cluster: Weak<Cluster>,
    pub(super) runtime: tokio::runtime::Handle,
}

impl UserReplicator for ClusterUsers {
    fn replicate(&self, user: &str, record: Option<Vec<u8>>) -> Result<(), BrokerError> {
        let cluster = self.cluster.upgrade().ok_or(BrokerError::ShuttingDown)?;
        let user = user.to_owned();
        let runtime = self.runtime.clone();
        // Called from a request's task or the blocking pool: the wait runs on a thread of its
        // own, outside any runtime, while this one steps aside for the runtime's other tasks.
        tokio::task::block_in_place(|| {
            std::thread::scope(|scope| {
                scope
                    .spawn(|| runtime.block_on(cluster.put_user_anywhere(&user, record)))
                    .join()
                    .unwrap_or_else(|_| Err(BrokerError::Storage("a user change panicked".into())))
            })
        })
    }
}

impl Cluster {
    /// Commits `record` as `user`'s (`None`: removes it) at the metadata group's leader, from
    /// any node. While the metadata holds no users yet, this node's users go first, all at once,
    /// so that no node loses its users to a set of one.
    pub(super) async fn put_user_anywhere(
        &self,
        user: &str,
        record: Option<Vec<u8>>,
    ) -> Result<(), BrokerError> {
        if self.local_metadata().is_some_and(|m| m.users().is_none()) {
            let users = self.broker.auth().user_records();
            let seed = Forwarded::SeedUsers {
                users: users.clone(),
            };
            let local = || {
                self.write_users(MetaCommand::SeedUsers {
                    users: users.clone(),
                })
            };
            self.metadata_request(&seed, "this node's users", local)
                .await?;
        }
        let request = Forwarded::PutUser {
            name: user.to_owned(),
            record: record.clone(),
        };
        let local = || self.write_users(user_command(user, record.clone()));
        self.metadata_request(&request, "the user's change", local)
            .await
            .map(|_| ())
    }

    /// Writes a change to the users here, the metadata group's leader.
    pub(super) async fn write_users(&self, command: MetaCommand) -> Result<(), BrokerError> {
        match self.write_metadata(command, "the user's change").await? {
            Ok(MetaOutcome::UserChanged) => Ok(()),
            Ok(other) => Err(BrokerError::Storage(format!(
                "the metadata answered a user's change with {other:?}"
            ))),
            Err(e) => Err(BrokerError::invalid("user", e.to_string())),
        }
    }

    /// One controller pass: this node's users made the metadata's; or, before the metadata
    /// holds any, the metadata leader's own users written to it.
    pub(super) async fn follow_users(&self, state: &MetadataState) {
        let auth = self.broker.auth();
        match state.users() {
            Some(users) => {
                if let Err(e) = auth.apply_replicated_users(users) {
                    tracing::warn!(error = %e, "cannot take the cluster's users; tried again");
                }
            }
            None if self.leads(GroupId::METADATA) => {
                let users = auth.user_records();
                if users.is_empty() {
                    return;
                }
                if let Err(e) = self.write_users(MetaCommand::SeedUsers { users }).await {
                    tracing::info!(error = %e, "writing this node's users to the cluster; tried again");
                }
            }
            None => {}
        }
    }
}

/// The metadata command that makes `record` `user`'s (`None`: removes the user).
pub(super) fn user_command(user: &str, record: Option<Vec<u8>>) -> MetaCommand {
    let name = user.to_owned();
    match record {
        Some(record) => MetaCommand::PutUser { name, record },
        None => MetaCommand::DeleteUser { name },
    }
}
