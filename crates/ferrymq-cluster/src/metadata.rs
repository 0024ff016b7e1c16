//! The metadata group's state machine: cluster membership, topics, and where each partition's
//! replicas live.
//!
//! Everything here is a pure function of the applied commands, so every replica computes the same
//! state, including placement. Invariants after every command:
//! - a partition's replicas are distinct members of the cluster, and there are at most as many as
//!   members (fewer only after a `RemoveNode` left too few nodes to refill it);
//! - the first replica is the partition's preferred leader;
//! - each partition has its own [`GroupId`], never reused, never the metadata group's.
//!
//! Placement is greedy and deterministic: the preferred leader is the member leading the fewest
//! partitions (then holding the fewest replicas, then the lowest id), the other replicas the
//! members holding the fewest replicas (then the lowest id). Over many partitions this spreads
//! leaders and replicas to within one of even. Planned here, not yet present: subscriptions,
//! users, grants and tokens.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{GroupId, NodeId};

/// The longest topic name accepted.
pub const MAX_TOPIC_NAME_BYTES: usize = 255;
/// The most partitions one topic may have.
pub const MAX_PARTITIONS_PER_TOPIC: u32 = 10_000;

/// A change to the cluster metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaCommand {
    /// A node joins the set that replicas are placed on.
    AddNode { node: NodeId },
    /// A node leaves; its replicas move to the least loaded remaining members.
    RemoveNode { node: NodeId },
    /// A topic, its partitions placed on `replicas` members each.
    CreateTopic {
        name: String,
        partitions: u32,
        replicas: u32,
        /// Topic configuration, opaque here.
        config: Vec<u8>,
    },
    /// Removes a topic; its partition groups are no longer placed anywhere.
    DeleteTopic { name: String },
    /// A node joins a running cluster (`ferrymq cluster add-node`), its peers reaching it at
    /// `cluster_addr`. Taken again as is, so that a retry succeeds; a removed node may join
    /// again.
    Join { node: NodeId, cluster_addr: String },
    /// A user's whole record (password hash, roles, grants, token hashes), opaque here: every
    /// node's broker takes it in place of its own.
    PutUser {
        name: String,
        #[serde(with = "crate::partition::as_bytes")]
        record: Vec<u8>,
    },
    /// A user removed.
    DeleteUser { name: String },
    /// The users of the node that first changes one, all at once: taken only while the
    /// metadata holds no users yet (a no-op after), so that nodes keep their users until the
    /// cluster holds a whole set.
    SeedUsers { users: BTreeMap<String, Vec<u8>> },
}

/// What a successful command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaOutcome {
    NodeAdded,
    /// How many partitions got a new replica in place of the removed node.
    NodeRemoved {
        moved_replicas: u32,
    },
    TopicCreated {
        partitions: Vec<PartitionPlacement>,
    },
    TopicDeleted,
    UserChanged,
}

/// Why a command was refused; the state is unchanged. Every replica refuses alike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MetaError {
    #[error("node {0} is already a member")]
    NodeExists(NodeId),
    #[error("node {0} is not a member")]
    NoSuchNode(NodeId),
    #[error("topic {0:?} already exists")]
    TopicExists(String),
    #[error("no topic {0:?}")]
    NoSuchTopic(String),
    #[error("invalid topic: {0}")]
    InvalidTopic(String),
    #[error("{needed} replicas asked for, {members} members")]
    NotEnoughNodes { needed: u32, members: u32 },
    #[error("node {0} was removed from the cluster; add it again with `ferrymq cluster add-node`")]
    Removed(NodeId),
    #[error("node {0} is the cluster's last member")]
    LastNode(NodeId),
}

/// Where one partition lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionPlacement {
    /// The partition's Raft group.
    pub group: GroupId,
    /// The nodes holding a replica; the first is the preferred leader.
    pub replicas: Vec<NodeId>,
}

/// One topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    /// Topic configuration, opaque here.
    pub config: Vec<u8>,
    /// Partition `i` is `partitions[i]`.
    pub partitions: Vec<PartitionPlacement>,
}

/// How many partitions a node leads (preferred) and holds a replica of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeLoad {
    pub leaders: u32,
    pub replicas: u32,
}

/// The cluster metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataState {
    nodes: BTreeSet<NodeId>,
    topics: BTreeMap<String, TopicMeta>,
    next_group: u64,
    /// Topics deleted and not created again since: a node that was down or behind when one was
    /// deleted drops its copy when it catches up.
    #[serde(default)]
    deleted: BTreeSet<String>,
    /// The cluster addresses of the nodes that joined a running cluster (the others are in
    /// every node's `--peers`).
    #[serde(default)]
    addrs: BTreeMap<NodeId, String>,
    /// Nodes removed and not joined again since: never placed on, never voters.
    #[serde(default)]
    removed: BTreeSet<NodeId>,
    /// Every user's record, opaque here, once the cluster holds its users (`users_held`).
    #[serde(default)]
    users: BTreeMap<String, Vec<u8>>,
    /// Whether a user change was ever written: from then on the users here are every node's.
    #[serde(default)]
    users_held: bool,
}

impl Default for MetadataState {
    fn default() -> Self {
        Self {
            nodes: BTreeSet::new(),
            topics: BTreeMap::new(),
            next_group: GroupId::METADATA.0 + 1,
            deleted: BTreeSet::new(),
            addrs: BTreeMap::new(),
            removed: BTreeSet::new(),
            users: BTreeMap::new(),
            users_held: false,
        }
    }
}

impl MetadataState {
    /// Applies one command; on error nothing changed.
    pub fn apply(&mut self, command: MetaCommand) -> Result<MetaOutcome, MetaError> {
        match command {
            MetaCommand::AddNode { node } => {
                if self.removed.contains(&node) {
                    return Err(MetaError::Removed(node));
                }
                if !self.nodes.insert(node) {
                    return Err(MetaError::NodeExists(node));
                }
                Ok(MetaOutcome::NodeAdded)
            }
            MetaCommand::PutUser { name, record } => {
                self.users.insert(name, record);
                self.users_held = true;
                Ok(MetaOutcome::UserChanged)
            }
            MetaCommand::SeedUsers { users } => {
                if !self.users_held {
                    self.users = users;
                    self.users_held = true;
                }
                Ok(MetaOutcome::UserChanged)
            }
            MetaCommand::DeleteUser { name } => {
                self.users.remove(&name);
                self.users_held = true;
                Ok(MetaOutcome::UserChanged)
            }
            MetaCommand::Join { node, cluster_addr } => {
                self.removed.remove(&node);
                self.addrs.insert(node, cluster_addr);
                self.nodes.insert(node);
                Ok(MetaOutcome::NodeAdded)
            }
            MetaCommand::RemoveNode { node } => self.remove_node(node),
            MetaCommand::CreateTopic {
                name,
                partitions,
                replicas,
                config,
            } => self.create_topic(name, partitions, replicas, config),
            MetaCommand::DeleteTopic { name } => match self.topics.remove(&name) {
                Some(_) => {
                    self.deleted.insert(name);
                    Ok(MetaOutcome::TopicDeleted)
                }
                None => Err(MetaError::NoSuchTopic(name)),
            },
        }
    }

    /// The members replicas are placed on.
    pub fn nodes(&self) -> &BTreeSet<NodeId> {
        &self.nodes
    }

    /// The cluster addresses of the nodes that joined a running cluster.
    pub fn joined_addrs(&self) -> &BTreeMap<NodeId, String> {
        &self.addrs
    }

    /// Every user's record, once the cluster holds its users (`None` before the first change).
    /// The first change of all is a [`MetaCommand::SeedUsers`].
    pub fn users(&self) -> Option<&BTreeMap<String, Vec<u8>>> {
        self.users_held.then_some(&self.users)
    }

    /// The nodes removed and not joined again.
    pub fn removed(&self) -> &BTreeSet<NodeId> {
        &self.removed
    }

    /// One topic.
    pub fn topic(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    /// Every topic, by name.
    pub fn topics(&self) -> &BTreeMap<String, TopicMeta> {
        &self.topics
    }

    /// Topics deleted and not created again since.
    pub fn deleted_topics(&self) -> &BTreeSet<String> {
        &self.deleted
    }

    /// Every partition group and its replicas.
    pub fn partition_groups(&self) -> impl Iterator<Item = &PartitionPlacement> {
        self.topics.values().flat_map(|t| t.partitions.iter())
    }

    /// Each member's load; members without partitions show zero.
    pub fn load(&self) -> BTreeMap<NodeId, NodeLoad> {
        let mut load: BTreeMap<NodeId, NodeLoad> = self
            .nodes
            .iter()
            .map(|&n| (n, NodeLoad::default()))
            .collect();
        for placement in self.partition_groups() {
            for (i, node) in placement.replicas.iter().enumerate() {
                if let Some(l) = load.get_mut(node) {
                    l.replicas += 1;
                    if i == 0 {
                        l.leaders += 1;
                    }
                }
            }
        }
        load
    }

    fn create_topic(
        &mut self,
        name: String,
        partitions: u32,
        replicas: u32,
        config: Vec<u8>,
    ) -> Result<MetaOutcome, MetaError> {
        if name.is_empty() || name.len() > MAX_TOPIC_NAME_BYTES {
            return Err(MetaError::InvalidTopic(format!(
                "name must be 1 to {MAX_TOPIC_NAME_BYTES} bytes"
            )));
        }
        if partitions == 0 || partitions > MAX_PARTITIONS_PER_TOPIC {
            return Err(MetaError::InvalidTopic(format!(
                "partitions must be 1 to {MAX_PARTITIONS_PER_TOPIC}"
            )));
        }
        if replicas == 0 {
            return Err(MetaError::InvalidTopic(
                "replicas must be at least 1".into(),
            ));
        }
        if self.topics.contains_key(&name) {
            return Err(MetaError::TopicExists(name));
        }
        let members = self.nodes.len() as u32;
        if replicas > members {
            return Err(MetaError::NotEnoughNodes {
                needed: replicas,
                members,
            });
        }
        let mut load = self.load();
        let mut placed = Vec::with_capacity(partitions as usize);
        for _ in 0..partitions {
            let replicas = place_replicas(&mut load, replicas as usize, &[]);
            placed.push(PartitionPlacement {
                group: GroupId(self.next_group),
                replicas,
            });
            self.next_group += 1;
        }
        self.deleted.remove(&name);
        self.topics.insert(
            name,
            TopicMeta {
                config,
                partitions: placed.clone(),
            },
        );
        Ok(MetaOutcome::TopicCreated { partitions: placed })
    }

    fn remove_node(&mut self, node: NodeId) -> Result<MetaOutcome, MetaError> {
        if !self.nodes.contains(&node) {
            return Err(MetaError::NoSuchNode(node));
        }
        if self.nodes.len() == 1 {
            return Err(MetaError::LastNode(node));
        }
        self.nodes.remove(&node);
        self.addrs.remove(&node);
        self.removed.insert(node);
        let mut load = self.load();
        let mut moved_replicas = 0;
        for topic in self.topics.values_mut() {
            for placement in &mut topic.partitions {
                let Some(at) = placement.replicas.iter().position(|&n| n == node) else {
                    continue;
                };
                placement.replicas.remove(at);
                let added = place_followers(&mut load, 1, &placement.replicas);
                if !added.is_empty() {
                    moved_replicas += 1;
                }
                placement.replicas.extend(added);
            }
        }
        Ok(MetaOutcome::NodeRemoved { moved_replicas })
    }
}

/// Picks a preferred leader and `count - 1` followers, updating `load`.
fn place_replicas(
    load: &mut BTreeMap<NodeId, NodeLoad>,
    count: usize,
    taken: &[NodeId],
) -> Vec<NodeId> {
    let leader = load
        .iter()
        .filter(|(n, _)| !taken.contains(n))
        .min_by_key(|(n, l)| (l.leaders, l.replicas, **n))
        .map(|(n, _)| *n);
    let Some(leader) = leader else {
        return Vec::new();
    };
    if let Some(l) = load.get_mut(&leader) {
        l.leaders += 1;
        l.replicas += 1;
    }
    let mut chosen = vec![leader];
    let mut taken_now: Vec<NodeId> = taken.to_vec();
    taken_now.push(leader);
    chosen.extend(place_followers(load, count - 1, &taken_now));
    chosen
}

/// Picks up to `count` least loaded members not in `taken`, updating `load`.
fn place_followers(
    load: &mut BTreeMap<NodeId, NodeLoad>,
    count: usize,
    taken: &[NodeId],
) -> Vec<NodeId> {
    let mut chosen: Vec<NodeId> = Vec::with_capacity(count);
    for _ in 0..count {
        let next = load
            .iter()
            .filter(|(n, _)| !taken.contains(n) && !chosen.contains(n))
            .min_by_key(|(n, l)| (l.replicas, **n))
            .map(|(n, _)| *n);
        let Some(next) = next else { break };
        if let Some(l) = load.get_mut(&next) {
            l.replicas += 1;
        }
        chosen.push(next);
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(nodes: u64) -> MetadataState {
        let mut state = MetadataState::default();
        for n in 1..=nodes {
            state.apply(MetaCommand::AddNode { node: n }).unwrap();
        }
        state
    }

    fn create(name: &str, partitions: u32, replicas: u32) -> MetaCommand {
        MetaCommand::CreateTopic {
            name: name.into(),
            partitions,
            replicas,
            config: b"retention=1d".to_vec(),
        }
    }

    fn spread(state: &MetadataState) -> (u32, u32, u32, u32) {
        let load = state.load();
        let leaders = load.values().map(|l| l.leaders);
        let replicas = load.values().map(|l| l.replicas);
        (
            leaders.clone().min().unwrap(),
            leaders.max().unwrap(),
            replicas.clone().min().unwrap(),
            replicas.max().unwrap(),
        )
    }

    #[test]
    fn placement_is_even_and_distinct() {
        let mut state = cluster(5);
        state.apply(create("a", 7, 3)).unwrap();
        state.apply(create("b", 3, 2)).unwrap();
        state.apply(create("c", 10, 3)).unwrap();
        for p in state.partition_groups() {
            let distinct: BTreeSet<_> = p.replicas.iter().collect();
            assert_eq!(distinct.len(), p.replicas.len());
            assert!(!p.group.is_metadata());
        }
        let (lmin, lmax, rmin, rmax) = spread(&state);
        assert!(lmax - lmin <= 1, "leaders {lmin}..{lmax}");
        assert!(rmax - rmin <= 1, "replicas {rmin}..{rmax}");
    }

    #[test]
    fn placement_is_deterministic() {
        let build = || {
            let mut state = cluster(4);
            state.apply(create("a", 9, 3)).unwrap();
            state.apply(create("b", 2, 1)).unwrap();
            state
        };
        assert_eq!(build(), build());
    }

    #[test]
    fn refusals_leave_the_state_unchanged() {
        let mut state = cluster(2);
        state.apply(create("a", 1, 2)).unwrap();
        let before = state.clone();
        assert_eq!(
            state.apply(create("a", 1, 1)),
            Err(MetaError::TopicExists("a".into()))
        );
        assert_eq!(
            state.apply(create("b", 1, 3)),
            Err(MetaError::NotEnoughNodes {
                needed: 3,
                members: 2
            })
        );
        assert!(matches!(
            state.apply(create("", 1, 1)),
            Err(MetaError::InvalidTopic(_))
        ));
        assert_eq!(
            state.apply(MetaCommand::AddNode { node: 1 }),
            Err(MetaError::NodeExists(1))
        );
        assert_eq!(state, before);
    }

    #[test]
    fn a_node_joins_with_its_address_and_a_removed_one_stays_out_until_it_joins_again() {
        let mut state = cluster(3);
        state.apply(create("a", 3, 3)).unwrap();
        let join = MetaCommand::Join {
            node: 4,
            cluster_addr: "10.0.0.4:7090".into(),
        };
        assert_eq!(state.apply(join.clone()), Ok(MetaOutcome::NodeAdded));
        // A retry is answered alike.
        assert_eq!(state.apply(join), Ok(MetaOutcome::NodeAdded));
        assert!(state.nodes().contains(&4));
        assert_eq!(state.joined_addrs()[&4], "10.0.0.4:7090");

        // Node 3's replicas move to node 4, the only member without one.
        assert_eq!(
            state.apply(MetaCommand::RemoveNode { node: 3 }),
            Ok(MetaOutcome::NodeRemoved { moved_replicas: 3 })
        );
        for p in state.partition_groups() {
            assert!(!p.replicas.contains(&3) && p.replicas.contains(&4), "{p:?}");
        }
        assert!(state.removed().contains(&3));
        // A configured peer list naming it again does not bring it back; a join does.
        assert_eq!(
            state.apply(MetaCommand::AddNode { node: 3 }),
            Err(MetaError::Removed(3))
        );
        let again = MetaCommand::Join {
            node: 3,
            cluster_addr: "10.0.0.3:7090".into(),
        };
        assert_eq!(state.apply(again), Ok(MetaOutcome::NodeAdded));
        assert!(state.removed().is_empty());

        let mut alone = cluster(1);
        assert_eq!(
            alone.apply(MetaCommand::RemoveNode { node: 1 }),
            Err(MetaError::LastNode(1))
        );
        assert_eq!(alone.nodes().len(), 1);
    }

    #[test]
    fn removing_a_node_moves_its_replicas() {
        let mut state = cluster(4);
        state.apply(create("a", 8, 3)).unwrap();
        let outcome = state.apply(MetaCommand::RemoveNode { node: 2 }).unwrap();
        assert!(
            matches!(outcome, MetaOutcome::NodeRemoved { moved_replicas } if moved_replicas > 0)
        );
        for p in state.partition_groups() {
            assert_eq!(p.replicas.len(), 3);
            assert!(!p.replicas.contains(&2));
        }
        state
            .apply(MetaCommand::DeleteTopic { name: "a".into() })
            .unwrap();
        assert!(state.topic("a").is_none());
        assert!(state.deleted_topics().contains("a"));
        assert_eq!(
            state.apply(create("b", 1, 1)).unwrap(),
            MetaOutcome::TopicCreated {
                partitions: vec![PartitionPlacement {
                    group: GroupId(9),
                    replicas: vec![1]
                }]
            }
        );
    }
}
