//! Who serves a replicated partition, and its subscriptions' cursors kept alike on its replicas.
//!
//! - **The serving gate.** Only the leader of a partition's group delivers its messages and takes
//!   acks for them, and only once it has applied every entry of earlier terms (its first entry
//!   of its own term is applied): by then it holds every cursor update and every deduplication
//!   id its predecessors committed. [`run_gate`] opens and closes each partition in the broker
//!   as leadership moves.
//! - **Cursor updates.** The broker's state writer hands the cursors of the partitions this node
//!   serves to [`ClusterReplicator`], which proposes them to each partition's group; a confirmed
//!   ACK is answered once committed. Every replica applies them ([`apply_update`]); the leader
//!   skips its own, which its broker already holds.
//!
//! An update entry is `writer node id (u64 LE) · serving term (u64 LE) · the broker's bytes`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use ferrymq_broker::{Broker, CursorReplicator, CursorUpdate, Topic};
use ferrymq_cluster::partition::{PartitionLogError, StateUpdate};
use ferrymq_cluster::{ClusterError, GroupId, NodeId, Request};

use super::Cluster;

/// How often the gate looks at the groups' leadership.
const GATE_EVERY: Duration = Duration::from_millis(20);

/// Bytes before the broker's own in an update entry.
pub(super) const HEADER_BYTES: usize = 16;

/// Proposes cursor updates of the partitions this node serves to their groups.
pub(super) struct ClusterReplicator {
    pub(super) cluster: Weak<Cluster>,
    pub(super) runtime: tokio::runtime::Handle,
}

impl CursorReplicator for ClusterReplicator {
    fn replicates(&self, topic: &str) -> bool {
        self.cluster
            .upgrade()
            .is_some_and(|c| c.replicated(topic).is_some())
    }

    fn replicate(&self, updates: Vec<CursorUpdate>) -> Vec<Result<(), String>> {
        let n = updates.len();
        let Some(cluster) = self.cluster.upgrade() else {
            return vec![Err("the cluster node is stopping".into()); n];
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // A flush at shutdown, on a runtime thread: the groups are stopping anyway, and the
            // leader to come holds what was committed before.
            return vec![Err("not replicated: the node is stopping".into()); n];
        }
        self.runtime.block_on(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for (index, update) in updates.into_iter().enumerate() {
                let cluster = cluster.clone();
                tasks.spawn(async move { (index, cluster.propose_update(update).await) });
            }
            let mut results = vec![Ok(()); n];
            while let Some(done) = tasks.join_next().await {
                match done {
                    Ok((index, result)) => results[index] = result,
                    Err(e) => {
                        if let Some(slot) = results.iter_mut().find(|r| r.is_ok()) {
                            *slot = Err(format!("a replication task failed: {e}"));
                        }
                    }
                }
            }
            results
        })
    }
}

impl Cluster {
    /// Proposes one partition's cursor update to its group, which this node must lead.
    async fn propose_update(&self, update: CursorUpdate) -> Result<(), String> {
        let meta = self
            .replicated(&update.topic)
            .ok_or_else(|| format!("topic '{}' is not replicated", update.topic))?;
        let placement = meta
            .partitions
            .get(update.partition as usize)
            .ok_or_else(|| format!("partition {} is not placed", update.partition))?;
        let mut payload = Vec::with_capacity(HEADER_BYTES + update.payload.len());
        payload.extend_from_slice(&self.settings.node_id.to_le_bytes());
        payload.extend_from_slice(&update.epoch.to_le_bytes());
        payload.extend_from_slice(&update.payload);
        let request = Request::State(StateUpdate { payload });
        let timeout = self.settings.write_timeout;
        match self.node.write(placement.group, request, timeout).await {
            Ok(_) => Ok(()),
            Err(ClusterError::NotLeader { .. }) => Err(format!(
                "this node no longer leads partition {} of '{}'",
                update.partition, update.topic
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The term in which this node may serve `group`: it leads it with a quorum's recent
    /// acknowledgement, and has applied an entry of its own term (so every entry of earlier
    /// terms too). Without the quorum, a node restarted after kill -9 takes up the leadership
    /// openraft restored from its vote and would deliver from its cursors of before the kill,
    /// while another node leads (messages acked with confirmation since came again); a leader cut
    /// off from its group stops delivering once its lease runs out.
    fn serving_term_of(&self, group: GroupId) -> Option<u64> {
        let metrics = self.node.metrics(group).ok()?;
        let m = metrics.borrow();
        let me = self.node_id();
        let alone = m.membership_config.membership().voter_ids().eq([me]);
        let leads = m.current_leader == Some(me)
            && self.confirmed_leader(m.state, alone, m.millis_since_quorum_ack);
        let caught_up = m
            .last_applied
            .is_some_and(|applied| applied.leader_id.term == m.current_term);
        (leads && caught_up).then_some(m.current_term)
    }

    /// One pass of the gate: every partition of every replicated topic opened where this node
    /// serves it, closed everywhere else.
    pub(super) fn update_gates(&self) {
        let Some(state) = self.local_metadata() else {
            return;
        };
        let me = self.node_id();
        for (name, meta) in state.topics() {
            let Ok(topic) = self.broker.topic(name) else {
                continue;
            };
            for (p, placement) in meta.partitions.iter().enumerate() {
                let term = if placement.replicas.contains(&me) {
                    self.serving_term_of(placement.group)
                } else {
                    None
                };
                if self.broker.serving_term(&topic, p as u32) != term {
                    self.broker.set_serving(&topic, p as u32, term);
                    match term {
                        Some(term) => {
                            tracing::debug!(topic = %name, partition = p, term, "serving")
                        }
                        None => tracing::debug!(topic = %name, partition = p, "not serving"),
                    }
                }
            }
        }
    }
}

/// Keeps the gates of this node's replicated partitions in step with leadership.
pub(super) async fn run_gate(cluster: Weak<Cluster>) {
    let mut ticks = tokio::time::interval(GATE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        cluster.update_gates();
        cluster.note_elections();
    }
}

/// Applies a committed cursor update to `partition` of `topic` on this node (`me`).
pub(super) fn apply_update(
    broker: &Broker,
    me: NodeId,
    topic: &Arc<Topic>,
    partition: u32,
    update: &StateUpdate,
) -> Result<(), PartitionLogError> {
    let bytes = &update.payload;
    if bytes.len() < HEADER_BYTES {
        return Err(PartitionLogError(
            "a cursor update is shorter than its header".into(),
        ));
    }
    let writer = u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes"));
    let serving = broker.serving_term(topic, partition);
    // Made here while this node serves the partition: its broker holds it, or newer. Also when
    // the entry's term (bytes 8..16) is not the one served: the gate looks at leadership every
    // 20 ms, so it can stay open across a lost and regained election, and a rebuild from this
    // entry would reopen on cursors older than this node's next entries, which this check then
    // skips: messages acked with confirmation would come again. (An entry of this node applied
    // while it serves is from its current stretch of serving: older ones precede, in the log,
    // the entry of its own term the gate waits for.)
    if writer == me && serving.is_some() {
        return Ok(());
    }
    if serving.is_some() {
        // Another replica serves the partition now: stop at once, before taking its cursors.
        broker.set_serving(topic, partition, None);
    }
    broker
        .apply_replicated_cursors(topic, partition, &bytes[HEADER_BYTES..])
        .map_err(|e| PartitionLogError(e.to_string()))
}
