//! The properties a finished run must have.

use std::collections::{BTreeMap, BTreeSet};

use ferrymq_cluster::metadata::MetadataState;
use ferrymq_cluster::partition::StoredBatch;
use ferrymq_cluster::storage::GroupData;
use ferrymq_cluster::{GroupId, NodeId};

use super::Sim;

/// Every violated property, as text; empty when the run is correct.
pub fn violations(sim: &Sim) -> Vec<String> {
    let mut found = Vec::new();
    found.extend(one_leader_per_term(sim));
    let members = sim.members.lock().clone();
    for (&group, nodes) in &members {
        if group.is_metadata() {
            found.extend(metadata_replicas(sim, nodes));
        } else {
            found.extend(partition_replicas(sim, group, nodes));
            found.extend(partition_states(sim, group, nodes));
        }
    }
    found.extend(sim.history.lock().read_violations.iter().cloned());
    found
}

/// Never two leaders of one group in one term.
fn one_leader_per_term(sim: &Sim) -> Vec<String> {
    let h = sim.history.lock();
    h.leaders
        .iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .map(|((group, term), nodes)| format!("{group} term {term}: leaders {nodes:?}"))
        .collect()
}

fn replica_data<R>(
    sim: &Sim,
    group: GroupId,
    node: NodeId,
    read: impl FnOnce(&GroupData) -> R,
) -> Option<R> {
    let storage = sim.node(node)?.storage(group).ok()?;
    Some(storage.state.read(read))
}

/// Every replica holds the same metadata, with every acknowledged topic and no topic that was
/// never asked for.
fn metadata_replicas(sim: &Sim, nodes: &BTreeSet<NodeId>) -> Vec<String> {
    let mut found = Vec::new();
    let (acked, attempted) = {
        let h = sim.history.lock();
        (h.topics_acked.clone(), h.topics_attempted.clone())
    };
    let mut states: BTreeMap<NodeId, MetadataState> = BTreeMap::new();
    for &node in nodes {
        let state = replica_data(sim, GroupId::METADATA, node, |d| match d {
            GroupData::Metadata(m) => Some(m.clone()),
            GroupData::Partition(_) => None,
        });
        match state.flatten() {
            Some(s) => {
                states.insert(node, s);
            }
            None => found.push(format!("metadata: node {node} has no metadata replica")),
        }
    }
    for (node, state) in &states {
        for name in &acked {
            if state.topic(name).is_none() {
                found.push(format!(
                    "metadata: node {node} lacks acknowledged topic {name}"
                ));
            }
        }
        for name in state.topics().keys() {
            if name != "orders" && !attempted.contains(name) {
                found.push(format!(
                    "metadata: node {node} has topic {name} nobody created"
                ));
            }
        }
    }
    let distinct: BTreeSet<String> = states.values().map(|s| format!("{s:?}")).collect();
    if distinct.len() > 1 {
        found.push(format!(
            "metadata: replicas differ after healing ({} versions)",
            distinct.len()
        ));
    }
    found
}

/// The cursor-like state of every replica: all alike, and for each key a value no older than
/// the last write acknowledged for it (a write acknowledged is never lost: not in a failover,
/// not in a snapshot sent to a replica, not in a restart from one).
fn partition_states(sim: &Sim, group: GroupId, nodes: &BTreeSet<NodeId>) -> Vec<String> {
    let mut found = Vec::new();
    let acked = sim
        .history
        .lock()
        .states_acked
        .get(&group)
        .cloned()
        .unwrap_or_default();
    let mut images = BTreeMap::new();
    for &node in nodes {
        let image = replica_data(sim, group, node, |d| match d {
            GroupData::Partition(p) => p.log().state_image().ok(),
            GroupData::Metadata(_) => None,
        })
        .flatten();
        let Some(image) = image else { continue };
        let states: BTreeMap<Vec<u8>, Vec<u8>> = bincode::deserialize(&image).unwrap_or_default();
        for &(key, id) in &acked {
            let held = states
                .get(&vec![key])
                .and_then(|v| v.as_slice().try_into().ok())
                .map(u64::from_be_bytes);
            if held.map_or(true, |h| h < id) {
                found.push(format!(
                    "{group}@{node}: state key {key} holds {held:?}, older than acknowledged {id}"
                ));
            }
        }
        images.insert(node, states);
    }
    let distinct: BTreeSet<_> = images.values().collect();
    if distinct.len() > 1 {
        found.push(format!("{group}: replicas' states differ: {images:?}"));
    }
    found
}

fn batches(sim: &Sim, group: GroupId, node: NodeId) -> Option<Vec<StoredBatch>> {
    replica_data(sim, group, node, |d| match d {
        GroupData::Partition(p) => p.all_batches().ok(),
        GroupData::Metadata(_) => None,
    })
    .flatten()
}

fn batch_id(stored: &StoredBatch) -> Option<u64> {
    let text = std::str::from_utf8(&stored.batch.payload).ok()?;
    text.split_once(':')?.1.parse().ok()
}

/// On every replica: each acknowledged write exactly once, at the offsets it was acknowledged
/// with, in acknowledgement order; no write twice; nothing that was never written; and all
/// replicas alike.
fn partition_replicas(sim: &Sim, group: GroupId, nodes: &BTreeSet<NodeId>) -> Vec<String> {
    let mut found = Vec::new();
    let (acked, attempted) = {
        let h = sim.history.lock();
        let acked = h.acked.get(&group).cloned().unwrap_or_default();
        (acked, h.attempted.get(&group).cloned().unwrap_or_default())
    };
    let mut logs = BTreeSet::new();
    for &node in nodes {
        let Some(log) = batches(sim, group, node) else {
            found.push(format!("{group}: node {node} has no replica"));
            continue;
        };
        let mut position: BTreeMap<u64, (usize, &StoredBatch)> = BTreeMap::new();
        for (i, stored) in log.iter().enumerate() {
            match batch_id(stored) {
                Some(id) if !attempted.contains(&id) => {
                    found.push(format!("{group}@{node}: write {id} never attempted"))
                }
                Some(id) => {
                    if position.insert(id, (i, stored)).is_some() {
                        found.push(format!("{group}@{node}: write {id} stored twice"));
                    }
                }
                None => found.push(format!(
                    "{group}@{node}: unreadable batch at {:?}",
                    stored.offsets
                )),
            }
        }
        let mut last_position = None;
        for ack in &acked {
            let Some(&(at, stored)) = position.get(&ack.id) else {
                found.push(format!(
                    "{group}@{node}: acknowledged write {} missing",
                    ack.id
                ));
                continue;
            };
            if stored.offsets != ack.offsets {
                found.push(format!(
                    "{group}@{node}: write {} acked at {:?}, stored at {:?}",
                    ack.id, ack.offsets, stored.offsets
                ));
            }
            if last_position.is_some_and(|p| p >= at) {
                found.push(format!(
                    "{group}@{node}: write {} out of acknowledgement order",
                    ack.id
                ));
            }
            last_position = Some(at);
        }
        logs.insert(format!("{log:?}"));
    }
    if logs.len() > 1 {
        found.push(format!("{group}: replicas differ after healing"));
    }
    found
}
