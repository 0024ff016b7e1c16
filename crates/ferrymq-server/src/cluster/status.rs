//! What an operator sees of this node's part in the cluster: each Raft group's role, term,
//! leader, log positions and, where this node leads, each follower's lag.

use std::collections::{BTreeMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

use super::Cluster;
use ferrymq_cluster::{GroupId, ServerState};

/// How many leader changes [`Cluster::elections`] keeps.
const ELECTIONS_KEPT: usize = 50;

/// A leader change this node saw: `leader` took `group` in `term`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Election {
    pub group: u64,
    /// The partition's topic and number; `None` for the metadata group.
    pub topic: Option<String>,
    pub partition: Option<u32>,
    pub term: u64,
    pub leader: u64,
    /// When this node first saw it, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// The leaders this node last saw per group, and the changes it saw, newest first.
#[derive(Debug, Default)]
pub(super) struct ElectionLog {
    known: BTreeMap<GroupId, (u64, u64)>,
    seen: VecDeque<Election>,
}

/// A follower further behind than this many entries makes its partition under-replicated.
pub const LAG_ENTRIES_MAX: u64 = 1000;

/// One Raft group on this node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupState {
    pub group: u64,
    /// The partition's topic and number; `None` for the metadata group.
    pub topic: Option<String>,
    pub partition: Option<u32>,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: String,
    pub term: u64,
    pub leader: Option<u64>,
    pub last_log_index: Option<u64>,
    pub applied_index: Option<u64>,
    /// The last entry the group's latest snapshot covers, and the last entry dropped from this
    /// node's log below it (`None`: none yet).
    #[serde(default)]
    pub snapshot_index: Option<u64>,
    #[serde(default)]
    pub purged_index: Option<u64>,
    /// The group's voters, as this node last applied its membership.
    #[serde(default)]
    pub voters: Vec<u64>,
    /// The highest index a leader of the group has told this node is committed since it
    /// started; `None` before it heard one (and where it leads: its own log is the group's).
    pub leader_commit: Option<u64>,
    /// Whether this replica has what the group committed: it leads, or it has heard from a
    /// leader since it started and applied up to that leader's commit index (and has stayed
    /// within [`LAG_ENTRIES_MAX`] entries of it since).
    pub caught_up: bool,
    /// Where this node leads: each other replica and how many entries it is behind (`None`:
    /// nothing replicated to it yet).
    pub followers: Vec<(u64, Option<u64>)>,
}

impl GroupState {
    /// Led here with a replica further behind than [`LAG_ENTRIES_MAX`], or not reached yet.
    pub fn under_replicated(&self) -> bool {
        self.role == "leader"
            && self.topic.is_some()
            && self
                .followers
                .iter()
                .any(|(_, lag)| lag.is_none_or(|lag| lag > LAG_ENTRIES_MAX))
    }
}

/// Whether a replica is caught up now, given whether it was at the last look (`was`): see
/// `Cluster::caught_up`.
fn catch_up(was: bool, leads: bool, applied: Option<u64>, heard: Option<Option<u64>>) -> bool {
    let (exact, close) = match (leads, heard) {
        (true, _) => (true, true),
        (_, Some(committed)) => {
            let behind = match (committed, applied) {
                (None, _) => 0,
                (Some(c), None) => c + 1,
                (Some(c), Some(a)) => c.saturating_sub(a),
            };
            (behind == 0, behind <= LAG_ENTRIES_MAX)
        }
        (_, None) => (false, false),
    };
    exact || (close && was)
}

fn role(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

impl Cluster {
    /// The leader changes this node saw, newest first (at most 50 kept).
    pub fn elections(&self) -> Vec<Election> {
        self.elections.lock().seen.iter().cloned().collect()
    }

    /// Notes the groups whose leader or term changed since the last look (the gate's pass).
    pub(super) fn note_elections(&self) {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut changed = Vec::new();
        {
            let mut log = self.elections.lock();
            for group in self.node.group_ids() {
                let Ok(metrics) = self.node.metrics(group) else {
                    continue;
                };
                let (term, leader) = {
                    let m = metrics.borrow();
                    (m.current_term, m.current_leader)
                };
                let Some(leader) = leader else { continue };
                if log.known.insert(group, (term, leader)) != Some((term, leader)) {
                    changed.push((group, term, leader));
                }
            }
        }
        if changed.is_empty() {
            return;
        }
        let topics = self.group_topics.lock().clone();
        let named: Vec<Election> = changed
            .into_iter()
            .map(|(group, term, leader)| {
                let (topic, partition) = self.group_name(&topics, group);
                Election {
                    group: group.0,
                    topic,
                    partition,
                    term,
                    leader,
                    at_ms: now_ms,
                }
            })
            .collect();
        let mut log = self.elections.lock();
        for election in named {
            log.seen.push_front(election);
        }
        log.seen.truncate(ELECTIONS_KEPT);
    }

    /// A partition group's topic and partition number, as far as this node knows them.
    fn group_name(
        &self,
        topics: &BTreeMap<GroupId, String>,
        group: GroupId,
    ) -> (Option<String>, Option<u32>) {
        match topics.get(&group) {
            Some(name) if group != GroupId::METADATA => {
                let partition = self.replicated(name).and_then(|t| {
                    t.partitions
                        .iter()
                        .position(|p| p.group == group)
                        .map(|p| p as u32)
                });
                (Some(name.clone()), partition)
            }
            _ => (None, None),
        }
    }

    /// Whether this replica of `group` has what the group committed. To become caught up it
    /// must lead with a quorum's acknowledgement (see `confirmed_leader`), or have heard from a leader since this node started and applied all that
    /// leader said was committed; it then stays caught up while it is within
    /// [`LAG_ENTRIES_MAX`] entries of the commit index, so that the moment between a
    /// follower hearing of a commit and applying it, under a steady stream of writes, does
    /// not make it flap.
    fn caught_up(
        &self,
        group: GroupId,
        leads: bool,
        applied: Option<u64>,
        heard: Option<Option<u64>>,
    ) -> bool {
        let mut latched = self.caught_up.lock();
        let caught_up = catch_up(latched.contains(&group), leads, applied, heard);
        match caught_up {
            true => latched.insert(group),
            false => latched.remove(&group),
        };
        caught_up
    }

    /// Whether this node leads the group with a quorum behind it: it is the only voter, or a
    /// quorum acknowledged it within two election timeouts. A node restarted alone may take up
    /// the leadership it had before (openraft restores a committed vote for itself) with no
    /// one to confirm it: not a leader to be ready on.
    pub(super) fn confirmed_leader(
        &self,
        state: ServerState,
        alone: bool,
        quorum_ack_ms: Option<u64>,
    ) -> bool {
        let lease_ms = 2 * self.settings.timing.election_timeout_max_ms;
        state == ServerState::Leader && (alone || quorum_ack_ms.is_some_and(|ms| ms <= lease_ms))
    }

    /// Every group running on this node, the metadata group first.
    pub fn group_states(&self) -> Vec<GroupState> {
        let topics = self.group_topics.lock().clone();
        let me = self.settings.node_id;
        let mut states = Vec::new();
        for group in self.node.group_ids() {
            let Ok(metrics) = self.node.metrics(group) else {
                continue;
            };
            let m = metrics.borrow().clone();
            let last = m.last_log_index;
            let followers = m
                .replication
                .as_ref()
                .map(|r| {
                    r.iter()
                        .filter(|(node, _)| **node != me)
                        .map(|(node, matched)| {
                            let lag = matched.map(|id| last.unwrap_or(0).saturating_sub(id.index));
                            (*node, lag)
                        })
                        .collect()
                })
                .unwrap_or_default();
            let (topic, partition) = self.group_name(&topics, group);
            let applied_index = m.last_applied.map(|id| id.index);
            let heard = self.node.router().leader_commit(group);
            let alone = m.membership_config.membership().voter_ids().eq([me]);
            let leads = self.confirmed_leader(m.state, alone, m.millis_since_quorum_ack);
            let caught_up = self.caught_up(group, leads, applied_index, heard);
            states.push(GroupState {
                group: group.0,
                topic,
                partition,
                role: role(m.state).to_owned(),
                term: m.current_term,
                leader: m.current_leader,
                last_log_index: last,
                applied_index,
                snapshot_index: m.snapshot.map(|id| id.index),
                purged_index: m.purged.map(|id| id.index),
                voters: m.membership_config.membership().voter_ids().collect(),
                leader_commit: heard.flatten(),
                caught_up,
                followers,
            });
        }
        states
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_catches_up_exactly_and_then_stays_within_the_lag_bound() {
        let follower = false;
        // Not heard from a leader since the start: never caught up, whatever it applied.
        assert!(!catch_up(true, follower, Some(50), None));
        // Heard: exactly there to become caught up.
        assert!(!catch_up(false, follower, Some(40), Some(Some(50))));
        assert!(!catch_up(false, follower, None, Some(Some(0))));
        assert!(catch_up(false, follower, Some(50), Some(Some(50))));
        assert!(catch_up(false, follower, None, Some(None)));
        // Once there, a commit heard a moment before it is applied does not undo it...
        assert!(catch_up(true, follower, Some(40), Some(Some(50))));
        // ... but falling further behind than the bound does.
        let far = Some(Some(40 + LAG_ENTRIES_MAX + 1));
        assert!(!catch_up(true, follower, Some(40), far));
        // A leader is caught up by definition.
        assert!(catch_up(false, true, Some(1), far));
    }
}
