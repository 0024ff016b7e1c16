//! Users held by a cluster rather than by one broker.
//!
//! In a cluster every change to a user (added, removed, a password, a grant, a token) is
//! committed by the cluster's metadata group before it applies anywhere: [`Auth`]'s one change
//! path hands the user's whole new record to a [`UserReplicator`], and applies it here only once
//! the replicator says it is committed. Every node then takes the cluster's records in place of
//! its own ([`Auth::apply_replicated_users`]), whatever node the change was made on, so a user,
//! a password or a token works on every node, and a revocation reaches every node.
//!
//! A record is whole (hash, roles, grants, token hashes): taking one again changes nothing, and
//! the last one committed wins.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{encode_record, Auth, User, UserRecord};
use crate::error::BrokerError;

/// Users' encoded records by name, as the cluster holds them.
pub(super) type Records = BTreeMap<String, Vec<u8>>;

/// Commits changes to users through the cluster.
pub trait UserReplicator: Send + Sync + 'static {
    /// Commits `record` (the encoded whole record; `None`: the user is removed) as `user`'s,
    /// blocking until it is committed. On an error nothing was applied here, and the caller
    /// is told why; the change may or may not have been committed (a retry is safe: records
    /// are whole).
    fn replicate(&self, user: &str, record: Option<Vec<u8>>) -> Result<(), BrokerError>;
}

impl Auth {
    /// Commits every change to users through `replicator` from now on (once; later calls are
    /// ignored).
    pub fn set_user_replicator(&self, replicator: Arc<dyn UserReplicator>) {
        let _ = self.replicator.set(replicator);
    }

    /// Every user's record, encoded as it is stored and replicated.
    pub fn user_records(&self) -> BTreeMap<String, Vec<u8>> {
        self.state
            .read()
            .users
            .iter()
            .map(|(name, user)| (name.clone(), encode_record(&user.record)))
            .collect()
    }

    /// Makes this broker's users exactly `users` (encoded records, as the cluster holds them):
    /// each differing record is stored and takes effect, each user not among them is removed.
    /// The cluster decided: no check is made here but that each record reads. Returns how many
    /// users changed; 0 also when a change made here is being committed (the next call takes
    /// the cluster's users after it), so a caller on a runtime thread never waits for one.
    pub fn apply_replicated_users(
        &self,
        users: &BTreeMap<String, Vec<u8>>,
    ) -> Result<usize, BrokerError> {
        let Some(_serial) = self.serial.try_lock() else {
            return Ok(0);
        };
        let generation = self.generation();
        let mut seen = self.replicated_seen.lock();
        if seen
            .as_ref()
            .is_some_and(|(g, taken)| *g == generation && taken == users)
        {
            return Ok(0);
        }
        let here = self.user_records();
        let mut changed = 0;
        for (name, bytes) in users {
            if here.get(name) == Some(bytes) {
                continue;
            }
            let record: UserRecord = serde_json::from_slice(bytes).map_err(|e| {
                BrokerError::Storage(format!(
                    "the cluster's record of user '{name}' is unreadable: {e}"
                ))
            })?;
            let parsed = User::new(record.clone())?;
            // Stored in the form this broker writes, so the next comparison finds it equal.
            self.install(name, Some(&record), Some(parsed))?;
            changed += 1;
        }
        for name in here.keys().filter(|name| !users.contains_key(*name)) {
            self.install(name, None, None)?;
            changed += 1;
        }
        if changed > 0 {
            tracing::info!(users = users.len(), changed, "users taken from the cluster");
        }
        *seen = Some((self.generation(), users.clone()));
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::auth::ROLE_ADMIN;

    /// Commits into a map, or refuses everything.
    #[derive(Default)]
    struct Log {
        committed: Mutex<BTreeMap<String, Vec<u8>>>,
        refuse: bool,
    }

    impl UserReplicator for Log {
        fn replicate(&self, user: &str, record: Option<Vec<u8>>) -> Result<(), BrokerError> {
            if self.refuse {
                return Err(BrokerError::NotLeader("no metadata leader".into()));
            }
            let mut committed = self.committed.lock().unwrap();
            match record {
                Some(record) => committed.insert(user.to_owned(), record),
                None => committed.remove(user),
            };
            Ok(())
        }
    }

    #[test]
    fn changes_are_committed_first_and_another_node_takes_them() {
        let log = Arc::new(Log::default());
        let one = Auth::open(None).unwrap();
        one.set_user_replicator(log.clone());
        one.add_user("admin", "admin-password", ROLE_ADMIN).unwrap();
        one.add_user("billing", "billing-password", 0).unwrap();
        one.grant("billing", "orders.*", crate::auth::ACTION_PUBLISH, 0)
            .unwrap();
        let token = one.create_token("billing", "deploy", 0).unwrap();
        let committed = log.committed.lock().unwrap().clone();
        assert_eq!(committed, one.user_records());

        // Another node with a user of its own takes the cluster's in its place.
        let two = Auth::open(None).unwrap();
        two.add_user("local", "local-password", ROLE_ADMIN).unwrap();
        assert_eq!(two.apply_replicated_users(&committed).unwrap(), 3);
        assert_eq!(two.user_records(), committed);
        assert!(two.authenticate("billing", "billing-password").is_ok());
        assert!(two.authenticate("", &token).is_ok());
        assert!(two.authenticate("local", "local-password").is_err());
        // Taken again, nothing changes.
        assert_eq!(two.apply_replicated_users(&committed).unwrap(), 0);

        // A revocation reaches it too.
        one.revoke_token("billing", "deploy").unwrap();
        let committed = log.committed.lock().unwrap().clone();
        assert_eq!(two.apply_replicated_users(&committed).unwrap(), 1);
        assert!(two.authenticate("", &token).is_err());
    }

    #[test]
    fn a_change_the_cluster_refuses_is_not_applied() {
        let refusing = Arc::new(Log {
            refuse: true,
            ..Log::default()
        });
        let auth = Auth::open(None).unwrap();
        auth.set_user_replicator(refusing);
        let error = auth
            .add_user("admin", "admin-password", ROLE_ADMIN)
            .unwrap_err();
        assert!(error.to_string().contains("no metadata leader"), "{error}");
        assert_eq!(auth.user_count(), 0);
        assert!(!auth.enabled());
    }
}
