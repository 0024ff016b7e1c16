//! A whole cluster in one process: N nodes, the metadata group and a few partition groups, an
//! in-process network with seeded faults, client writers, and a fault schedule.
//!
//! Determinism: everything runs on one current-thread tokio runtime with paused time, so tasks
//! interleave the same way on every run; the network's faults, the workload and fault schedule,
//! and openraft's election timeouts all come from the one seed. `replays_identically` checks
//! that two runs of a seed produce the same trace.

pub mod check;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ferrymq_cluster::inproc::{FaultConfig, InProcNetwork, InProcTransport, NetStats};
use ferrymq_cluster::metadata::{MetaCommand, MetaError, MetaOutcome, PartitionPlacement};
use ferrymq_cluster::partition::{MemPartitionLog, OffsetRange, RecordBatch, StateUpdate};
use ferrymq_cluster::storage::GroupStorage;
use ferrymq_cluster::types::LogId;
use ferrymq_cluster::{ClusterError, ClusterNode, GroupId, GroupTiming, NodeId, Request, Response};
use openraft::ServerState;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How long a client waits for one write or read.
pub const CLIENT_TIMEOUT: Duration = Duration::from_millis(1_000);
/// How long a client waits after a failed attempt.
pub const CLIENT_BACKOFF: Duration = Duration::from_millis(50);

pub type Node = ClusterNode<InProcTransport>;

/// One simulated run's shape.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    pub seed: u64,
    pub nodes: u64,
    pub partitions: u32,
    /// How long writers and faults run before everything heals.
    pub workload_ms: u64,
    /// How long the healed cluster gets to converge.
    pub converge_ms: u64,
}

/// A client write to a partition and what came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionAck {
    pub id: u64,
    pub offsets: OffsetRange,
}

/// Everything observed during a run; the checks read it afterwards.
#[derive(Debug, Default)]
pub struct History {
    /// Per partition group: writes attempted (ids) and acknowledged, in ack order.
    pub attempted: BTreeMap<GroupId, BTreeSet<u64>>,
    pub acked: BTreeMap<GroupId, Vec<PartitionAck>>,
    /// Per partition group: cursor-like state writes (key, write id) acknowledged, in order.
    pub states_acked: BTreeMap<GroupId, Vec<(u8, u64)>>,
    /// Topics whose creation was attempted and acknowledged, in ack order.
    pub topics_attempted: BTreeSet<String>,
    pub topics_acked: Vec<String>,
    /// Linearizable reads done, and those that missed an acknowledged topic.
    pub reads_ok: u64,
    pub read_violations: Vec<String>,
    /// (group, term) -> nodes that reported being leader, in their metrics or by acknowledging
    /// a write proposed in that term.
    pub leaders: BTreeMap<(GroupId, u64), BTreeSet<NodeId>>,
    /// A fingerprint of the run: events in order, with sim time.
    pub trace: Vec<String>,
    pub faults: Vec<String>,
}

/// The simulated cluster.
pub struct Sim {
    pub config: SimConfig,
    pub net: InProcNetwork,
    pub start: tokio::time::Instant,
    pub live: Mutex<BTreeMap<NodeId, Arc<Node>>>,
    /// Storage of stopped nodes, kept for their restart.
    pub disks: Mutex<BTreeMap<NodeId, BTreeMap<GroupId, GroupStorage>>>,
    /// Members of each group.
    pub members: Mutex<BTreeMap<GroupId, BTreeSet<NodeId>>>,
    pub history: Mutex<History>,
    pub timing: GroupTiming,
}

impl Sim {
    pub fn new(config: SimConfig, faults: FaultConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            net: InProcNetwork::new(config.seed, faults),
            start: tokio::time::Instant::now(),
            live: Mutex::new(BTreeMap::new()),
            disks: Mutex::new(BTreeMap::new()),
            members: Mutex::new(BTreeMap::new()),
            history: Mutex::new(History::default()),
            // Snapshots every few entries, so that histories purge logs and send snapshots to
            // replicas left behind.
            timing: GroupTiming {
                snapshot_every: 16,
                entries_kept: 4,
                ..GroupTiming::default()
            },
        })
    }

    pub fn now_ms(&self) -> u128 {
        self.start.elapsed().as_millis()
    }

    pub fn trace(&self, event: String) {
        let line = format!("{:>6} {event}", self.now_ms());
        self.history.lock().trace.push(line);
    }

    pub fn node(&self, id: NodeId) -> Option<Arc<Node>> {
        self.live.lock().get(&id).cloned()
    }

    pub fn group_members(&self, group: GroupId) -> Vec<NodeId> {
        let members = self.members.lock();
        members
            .get(&group)
            .map(|m| m.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Starts a node with the given groups' storage (new or kept) and watches its leaders.
    pub async fn start_node(self: &Arc<Self>, id: NodeId, groups: BTreeMap<GroupId, GroupStorage>) {
        let node = Arc::new(ClusterNode::new(self.net.transport(id), self.timing));
        self.net.attach(id, node.router());
        for (group, storage) in groups {
            self.start_group_on(&node, group, storage).await;
        }
        let _clock = node.spawn_heartbeats();
        self.live.lock().insert(id, node);
        self.net.set_down(id, false);
    }

    pub async fn start_group_on(
        self: &Arc<Self>,
        node: &Arc<Node>,
        group: GroupId,
        storage: GroupStorage,
    ) {
        let raft = node.start_group(group, storage).await.expect("start group");
        let mut metrics = raft.metrics();
        let sim = self.clone();
        tokio::spawn(async move {
            loop {
                let (state, term, id) = {
                    let m = metrics.borrow_and_update();
                    (m.state, m.current_term, m.id)
                };
                if state == ServerState::Leader {
                    let mut h = sim.history.lock();
                    h.leaders.entry((group, term)).or_default().insert(id);
                }
                if metrics.changed().await.is_err() {
                    break;
                }
            }
        });
    }

    /// Crashes a node: its groups stop, the network stops reaching it, its storage is kept.
    pub async fn kill(&self, id: NodeId) {
        let Some(node) = self.live.lock().remove(&id) else {
            return;
        };
        self.net.set_down(id, true);
        let stored = node.shutdown().await;
        self.disks.lock().insert(id, stored);
    }

    pub async fn restart(self: &Arc<Self>, id: NodeId) {
        let Some(stored) = self.disks.lock().remove(&id) else {
            return;
        };
        self.start_node(id, stored).await;
    }

    /// The node the client should try next after `tried`.
    fn next_member(&self, group: GroupId, tried: NodeId) -> NodeId {
        let members = self.group_members(group);
        let at = members
            .iter()
            .position(|&n| n == tried)
            .map_or(0, |i| i + 1);
        members[at % members.len()]
    }

    /// One attempt at a write through `hint`; on failure, where to try next.
    pub async fn write_once(
        &self,
        group: GroupId,
        hint: &mut NodeId,
        request: Request,
    ) -> Option<(LogId, Response)> {
        let result = match self.node(*hint) {
            Some(node) => node.write(group, request, CLIENT_TIMEOUT).await,
            None => Err(ClusterError::NoSuchGroup(group)),
        };
        match result {
            Ok(done) => {
                // The entry's term names the leader that proposed it: the node that acknowledged.
                let term = done.0.leader_id.term;
                let mut h = self.history.lock();
                h.leaders.entry((group, term)).or_default().insert(*hint);
                Some(done)
            }
            Err(ClusterError::NotLeader {
                leader: Some(l), ..
            }) if l != *hint => {
                *hint = l;
                None
            }
            Err(_) => {
                *hint = self.next_member(group, *hint);
                tokio::time::sleep(CLIENT_BACKOFF).await;
                None
            }
        }
    }

    /// Writes `command` to the metadata group until it is acknowledged.
    pub async fn meta_until_done(&self, command: MetaCommand) -> Result<MetaOutcome, MetaError> {
        let mut hint = 1;
        loop {
            let request = Request::Metadata(command.clone());
            if let Some((_, Response::Metadata(outcome))) =
                self.write_once(GroupId::METADATA, &mut hint, request).await
            {
                return outcome;
            }
        }
    }

    pub fn net_stats(&self) -> NetStats {
        self.net.stats()
    }
}

/// Bootstraps: metadata group on every node, members added, one topic whose partitions become
/// groups on the nodes placement chose.
pub async fn bootstrap(sim: &Arc<Sim>) -> Vec<PartitionPlacement> {
    let all: BTreeSet<NodeId> = (1..=sim.config.nodes).collect();
    sim.members.lock().insert(GroupId::METADATA, all.clone());
    for &id in &all {
        let groups = BTreeMap::from([(GroupId::METADATA, GroupStorage::metadata())]);
        sim.start_node(id, groups).await;
    }
    let first = sim.node(1).expect("node 1 is up");
    first
        .initialize(GroupId::METADATA, &all)
        .await
        .expect("initialize metadata");
    for &id in &all {
        match sim.meta_until_done(MetaCommand::AddNode { node: id }).await {
            Ok(_) | Err(MetaError::NodeExists(_)) => {}
            Err(e) => panic!("seed {}: add node {id}: {e}", sim.config.seed),
        }
    }
    let create = MetaCommand::CreateTopic {
        name: "orders".into(),
        partitions: sim.config.partitions,
        replicas: 3,
        config: b"retention.ms=86400000".to_vec(),
    };
    let placement = match sim.meta_until_done(create).await {
        Ok(MetaOutcome::TopicCreated { partitions }) => partitions,
        other => panic!("seed {}: create topic: {other:?}", sim.config.seed),
    };
    for p in &placement {
        start_partition_group(sim, p).await;
    }
    placement
}

async fn start_partition_group(sim: &Arc<Sim>, placement: &PartitionPlacement) {
    let replicas: BTreeSet<NodeId> = placement.replicas.iter().copied().collect();
    sim.members.lock().insert(placement.group, replicas.clone());
    for &id in &placement.replicas {
        let node = sim.node(id).expect("bootstrap runs without faults");
        let storage = GroupStorage::partition(Box::new(MemPartitionLog::durable()));
        sim.start_group_on(&node, placement.group, storage).await;
    }
    let preferred = sim
        .node(placement.replicas[0])
        .expect("preferred leader is up");
    preferred
        .initialize(placement.group, &replicas)
        .await
        .expect("initialize partition group");
}

/// A producer writing batches to one partition, one at a time, until `until_ms`.
pub async fn partition_writer(sim: Arc<Sim>, group: GroupId, until_ms: u128) {
    let mut hint = sim.group_members(group)[0];
    let mut next_id = 0u64;
    while sim.now_ms() < until_ms {
        let id = next_id;
        next_id += 1;
        sim.history
            .lock()
            .attempted
            .entry(group)
            .or_default()
            .insert(id);
        if id % 4 == 3 {
            // A cursor-like update between the batches: key `id % 2` takes the value `id`.
            let key = (id % 2) as u8;
            let mut payload = vec![1, key];
            payload.extend_from_slice(&id.to_be_bytes());
            let update = Request::State(StateUpdate { payload });
            if let Some((log_id, Response::StateApplied)) =
                sim.write_once(group, &mut hint, update).await
            {
                sim.trace(format!("state {group} key={key} id={id} at {log_id}"));
                let mut h = sim.history.lock();
                h.states_acked.entry(group).or_default().push((key, id));
            }
            continue;
        }
        let batch = RecordBatch {
            record_count: 1 + (id % 3) as u32,
            payload: format!("{}:{id}", group.0).into_bytes(),
        };
        // Each attempt is a new write: a retried timeout could otherwise be stored twice.
        if let Some((log_id, response)) = sim
            .write_once(group, &mut hint, Request::Append(batch))
            .await
        {
            let Response::Appended(Ok(offsets)) = response else {
                panic!("seed {}: append refused: {response:?}", sim.config.seed);
            };
            sim.trace(format!("ack {group} id={id} {offsets:?} at {log_id}"));
            let mut h = sim.history.lock();
            h.acked
                .entry(group)
                .or_default()
                .push(PartitionAck { id, offsets });
        }
    }
}

/// Creates topics, one at a time, and after each acknowledgement reads the metadata back
/// linearizably: the read must see every topic acknowledged before it started.
pub async fn metadata_writer(sim: Arc<Sim>, until_ms: u128) {
    let mut hint = 1;
    let mut next = 0u64;
    while sim.now_ms() < until_ms {
        let name = format!("t{next}");
        next += 1;
        sim.history.lock().topics_attempted.insert(name.clone());
        let command = MetaCommand::CreateTopic {
            name: name.clone(),
            partitions: 1,
            replicas: 1,
            config: Vec::new(),
        };
        let Some((_, response)) = sim
            .write_once(GroupId::METADATA, &mut hint, Request::Metadata(command))
            .await
        else {
            continue;
        };
        assert!(
            matches!(
                response,
                Response::Metadata(Ok(MetaOutcome::TopicCreated { .. }))
            ),
            "seed {}: create {name}: {response:?}",
            sim.config.seed
        );
        sim.trace(format!("ack topic {name}"));
        sim.history.lock().topics_acked.push(name);
        linearizable_read(&sim, hint).await;
    }
}

/// Reads the metadata at a random node every few moments until `until_ms`: a node that is not
/// the leader, or a leader cut off from the majority, must refuse rather than answer stale.
pub async fn metadata_reader(sim: Arc<Sim>, mut rng: StdRng, until_ms: u128) {
    while sim.now_ms() < until_ms {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(20..200))).await;
        let at = rng.gen_range(1..=sim.config.nodes);
        linearizable_read(&sim, at).await;
    }
}

async fn linearizable_read(sim: &Sim, at: NodeId) {
    let must_see: Vec<String> = sim.history.lock().topics_acked.clone();
    let Some(node) = sim.node(at) else { return };
    let read = node
        .read_metadata(GroupId::METADATA, CLIENT_TIMEOUT, |m| {
            m.topics().keys().cloned().collect::<BTreeSet<String>>()
        })
        .await;
    let Ok(seen) = read else { return };
    let mut h = sim.history.lock();
    h.reads_ok += 1;
    for name in must_see {
        if !seen.contains(&name) {
            h.read_violations.push(format!(
                "read at node {at} missed acknowledged topic {name}"
            ));
        }
    }
}

/// Kills and restarts nodes and cuts and heals the network, at seeded instants, until `until_ms`.
/// At most a minority is down at once, so a majority can make progress between faults.
pub async fn fault_schedule(sim: Arc<Sim>, mut rng: StdRng, until_ms: u128) {
    let nodes: Vec<NodeId> = (1..=sim.config.nodes).collect();
    let max_down = (nodes.len() - 1) / 2;
    while sim.now_ms() < until_ms {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..1_000))).await;
        let down: Vec<NodeId> = sim.disks.lock().keys().copied().collect();
        let event = match rng.gen_range(0..10) {
            0..=2 if down.len() < max_down => {
                let victim = pick_victim(&sim, &mut rng, &nodes);
                sim.kill(victim).await;
                format!("kill {victim}")
            }
            3 | 4 if down.len() < max_down => {
                // A crash and a quick restart: what it persisted must be enough.
                let victim = pick_victim(&sim, &mut rng, &nodes);
                sim.kill(victim).await;
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..400))).await;
                sim.restart(victim).await;
                format!("bounce {victim}")
            }
            0..=5 if !down.is_empty() => {
                let back = down[rng.gen_range(0..down.len())];
                sim.restart(back).await;
                format!("restart {back}")
            }
            6 | 7 => {
                let cut = random_minority(&mut rng, &nodes);
                sim.net.partition(std::slice::from_ref(&cut));
                format!("partition {cut:?}")
            }
            _ => {
                sim.net.heal();
                "heal".to_string()
            }
        };
        sim.trace(format!("fault {event}"));
        sim.history.lock().faults.push(event);
    }
}

/// Prefers the current leader of a random group: killing leaders is what forces elections.
fn pick_victim(sim: &Sim, rng: &mut StdRng, nodes: &[NodeId]) -> NodeId {
    let groups: Vec<GroupId> = sim.members.lock().keys().copied().collect();
    let group = groups[rng.gen_range(0..groups.len())];
    let live: Vec<Arc<Node>> = sim.live.lock().values().cloned().collect();
    for node in live {
        let leads = node
            .metrics(group)
            .map(|m| m.borrow().state == ServerState::Leader)
            .unwrap_or(false);
        if leads {
            return node.id();
        }
    }
    nodes[rng.gen_range(0..nodes.len())]
}

fn random_minority(rng: &mut StdRng, nodes: &[NodeId]) -> BTreeSet<NodeId> {
    let size = rng.gen_range(1..=(nodes.len() - 1) / 2);
    let mut cut = BTreeSet::new();
    while cut.len() < size {
        cut.insert(nodes[rng.gen_range(0..nodes.len())]);
    }
    cut
}

/// Ends every fault, restarts every node, and waits until each group's replicas have applied
/// the same last entry (or the time runs out; the checks then report what differs).
pub async fn heal_and_converge(sim: &Arc<Sim>) {
    sim.net.heal();
    sim.net.set_faults(FaultConfig::default());
    let down: Vec<NodeId> = sim.disks.lock().keys().copied().collect();
    for id in down {
        sim.restart(id).await;
    }
    sim.trace("healed".into());
    let deadline = sim.now_ms() + u128::from(sim.config.converge_ms);
    while sim.now_ms() < deadline && !converged(sim) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn converged(sim: &Sim) -> bool {
    let members = sim.members.lock().clone();
    members.iter().all(|(&group, nodes)| {
        let applied: BTreeSet<Option<LogId>> = nodes
            .iter()
            .map(|&id| {
                sim.node(id)
                    .and_then(|n| n.storage(group).ok())
                    .and_then(|s| s.state.last_applied())
            })
            .collect();
        let last_logs: BTreeSet<Option<u64>> = nodes
            .iter()
            .map(|&id| {
                sim.node(id)
                    .and_then(|n| n.storage(group).ok())
                    .and_then(|s| {
                        s.log
                            .last_index()
                            .max(s.state.snapshot_last().map(|l| l.index))
                    })
            })
            .collect();
        applied.len() == 1
            && last_logs.len() == 1
            && applied.iter().next().and_then(|a| a.map(|l| l.index))
                == *last_logs.iter().next().unwrap_or(&None)
    })
}

/// Runs one seed start to finish on a fresh current-thread runtime with paused time.
pub fn run(config: SimConfig) -> (Arc<Sim>, Vec<PartitionPlacement>) {
    ferrymq_cluster::runtime::seed_thread_rng(config.seed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let mut rng = StdRng::seed_from_u64(config.seed.rotate_left(17) ^ 0x5eed);
        let min_delay_ms = rng.gen_range(1..5);
        let faults = FaultConfig {
            loss_per_million: rng.gen_range(0..50_000),
            min_delay_ms,
            max_delay_ms: min_delay_ms + rng.gen_range(0..30),
        };
        let sim = Sim::new(config, faults);
        let placement = bootstrap(&sim).await;
        let until_ms = sim.now_ms() + u128::from(config.workload_ms);
        let mut tasks = Vec::new();
        for p in &placement {
            tasks.push(tokio::spawn(partition_writer(
                sim.clone(),
                p.group,
                until_ms,
            )));
        }
        tasks.push(tokio::spawn(metadata_writer(sim.clone(), until_ms)));
        let reader_rng = StdRng::seed_from_u64(rng.gen());
        tasks.push(tokio::spawn(metadata_reader(
            sim.clone(),
            reader_rng,
            until_ms,
        )));
        tasks.push(tokio::spawn(fault_schedule(sim.clone(), rng, until_ms)));
        for task in tasks {
            task.await.expect("simulation task");
        }
        heal_and_converge(&sim).await;
        (sim, placement)
    })
}
