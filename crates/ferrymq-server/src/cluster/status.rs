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
            states.push(GroupState {
                group: group.0,
                topic,
                partition,
                role: role(m.state).to_owned(),
                term: m.current_term,
                leader: m.current_leader,
                last_log_index: last,
                applied_index: m.last_applied.map(|id| id.index),
                followers,
            });
        }
        states
    }
}
