//! What an operator sees of this node's part in the cluster: each Raft group's role, term,
//! leader, log positions and, where this node leads, each follower's lag.

use super::Cluster;
use ferrymq_cluster::{GroupId, ServerState};

/// A follower further behind than this many entries makes its partition under-replicated.
pub const LAG_ENTRIES_MAX: u64 = 1000;

/// One Raft group on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupState {
    pub group: u64,
    /// The partition's topic and number; `None` for the metadata group.
    pub topic: Option<String>,
    pub partition: Option<u32>,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: &'static str,
    pub term: u64,
    pub leader: Option<u64>,
    pub last_log_index: Option<u64>,
    pub applied_index: Option<u64>,
    /// The highest index a leader of the group has told this node is committed since it
    /// started; `None` before it heard one (and where it leads: its own log is the group's).
    pub leader_commit: Option<u64>,
    /// Whether this replica has what the group committed: it leads, or it has heard from a
    /// leader since it started and applied up to that leader's commit index.
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
            let (topic, partition) = match topics.get(&group) {
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
            };
            let applied_index = m.last_applied.map(|id| id.index);
            let heard = self.node.router().leader_commit(group);
            let caught_up = match (m.state, heard) {
                (ServerState::Leader, _) => true,
                (_, Some(committed)) => applied_index >= committed,
                (_, None) => false,
            };
            states.push(GroupState {
                group: group.0,
                topic,
                partition,
                role: role(m.state),
                term: m.current_term,
                leader: m.current_leader,
                last_log_index: last,
                applied_index,
                leader_commit: heard.flatten(),
                caught_up,
                followers,
            });
        }
        states
    }
}
