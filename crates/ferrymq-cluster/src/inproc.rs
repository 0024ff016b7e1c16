//! An in-process [`Transport`] with seeded fault injection, for tests and the simulation.
//!
//! Every ordered pair of nodes has one link: a bounded queue drained by one connection task,
//! which takes whatever envelopes are waiting (of any group, up to [`MAX_FRAME_ENVELOPES`]) as
//! one frame. Each frame is then lost or delayed as a whole; because frames get independent
//! delays, a later frame can overtake an earlier one (reordering). Replies travel back with a
//! loss and delay of their own.
//!
//! Faults: a loss probability, a delay range, nodes marked down (nothing reaches them or leaves
//! them) and a network partition into sides (nothing crosses between sides). Every random choice
//! comes from one `StdRng` seeded at construction, so on a current-thread tokio runtime with
//! paused time the same seed makes the same faults at the same instants.
//!
//! Invariants: queues hold at most [`LINK_QUEUE_CAPACITY`] envelopes; a lost message is seen by
//! the caller as a timeout at its deadline, never as an early error; reachability is checked both
//! when a frame leaves and when it arrives, so a node that goes down in between gets nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, oneshot};

use crate::transport::{Envelope, RaftReply, SharedRouter, Transport, TransportError};
use crate::types::NodeId;

/// The most envelopes one link holds waiting.
pub const LINK_QUEUE_CAPACITY: usize = 1024;
/// The most envelopes one frame carries.
pub const MAX_FRAME_ENVELOPES: usize = 256;

/// How the network misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultConfig {
    /// Chance, per million, that a frame or a reply is lost.
    pub loss_per_million: u32,
    /// A frame or reply takes `min_delay_ms..=max_delay_ms`, drawn for each.
    pub min_delay_ms: u64,
    pub max_delay_ms: u64,
}

impl Default for FaultConfig {
    fn default() -> Self {
        Self {
            loss_per_million: 0,
            min_delay_ms: 1,
            max_delay_ms: 1,
        }
    }
}

/// Counts of what the network did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    pub frames_sent: u64,
    pub envelopes_sent: u64,
    pub frames_lost: u64,
    pub replies_lost: u64,
}

struct Pending {
    envelope: Envelope,
    reply: oneshot::Sender<Result<RaftReply, TransportError>>,
}

struct NetState {
    rng: StdRng,
    faults: FaultConfig,
    routers: BTreeMap<NodeId, SharedRouter>,
    down: BTreeSet<NodeId>,
    /// Side of each node; nodes not listed are on side 0.
    side: BTreeMap<NodeId, u32>,
    links: BTreeMap<(NodeId, NodeId), mpsc::Sender<Pending>>,
    stats: NetStats,
}

impl NetState {
    fn reachable(&self, from: NodeId, to: NodeId) -> bool {
        let side = |n: NodeId| self.side.get(&n).copied().unwrap_or(0);
        !self.down.contains(&from) && !self.down.contains(&to) && side(from) == side(to)
    }

    /// `None`: lost. `Some(d)`: arrives after `d`.
    fn fate(&mut self, from: NodeId, to: NodeId) -> Option<Duration> {
        let lost = self.rng.gen_range(0..1_000_000) < self.faults.loss_per_million;
        let delay_ms = self.rng.gen_range(
            self.faults.min_delay_ms..=self.faults.max_delay_ms.max(self.faults.min_delay_ms),
        );
        if lost || !self.reachable(from, to) {
            None
        } else {
            Some(Duration::from_millis(delay_ms))
        }
    }
}

/// The whole in-process network. Clones share it.
#[derive(Clone)]
pub struct InProcNetwork {
    state: Arc<Mutex<NetState>>,
}

impl InProcNetwork {
    /// A network drawing every random choice from `seed`.
    pub fn new(seed: u64, faults: FaultConfig) -> Self {
        Self {
            state: Arc::new(Mutex::new(NetState {
                rng: StdRng::seed_from_u64(seed),
                faults,
                routers: BTreeMap::new(),
                down: BTreeSet::new(),
                side: BTreeMap::new(),
                links: BTreeMap::new(),
                stats: NetStats::default(),
            })),
        }
    }

    /// The transport node `node` sends with.
    pub fn transport(&self, node: NodeId) -> InProcTransport {
        InProcTransport {
            network: self.clone(),
            node,
        }
    }

    /// Delivers envelopes addressed to `node` to `router` from now on.
    pub fn attach(&self, node: NodeId, router: SharedRouter) {
        self.state.lock().routers.insert(node, router);
    }

    /// Marks `node` down (crashed) or up.
    pub fn set_down(&self, node: NodeId, down: bool) {
        let mut state = self.state.lock();
        if down {
            state.down.insert(node);
        } else {
            state.down.remove(&node);
        }
    }

    /// Splits the network: each set is a side; nodes in no set form one more side.
    pub fn partition(&self, sides: &[BTreeSet<NodeId>]) {
        let mut state = self.state.lock();
        state.side.clear();
        for (i, nodes) in sides.iter().enumerate() {
            for &n in nodes {
                state.side.insert(n, i as u32 + 1);
            }
        }
    }

    /// Ends any partition.
    pub fn heal(&self) {
        self.state.lock().side.clear();
    }

    /// Changes loss and delay.
    pub fn set_faults(&self, faults: FaultConfig) {
        self.state.lock().faults = faults;
    }

    /// How many links (one per ordered pair of nodes that talked) exist.
    pub fn link_count(&self) -> usize {
        self.state.lock().links.len()
    }

    /// What the network has done so far.
    pub fn stats(&self) -> NetStats {
        self.state.lock().stats
    }

    fn link(&self, from: NodeId, to: NodeId) -> mpsc::Sender<Pending> {
        let mut state = self.state.lock();
        if let Some(link) = state.links.get(&(from, to)) {
            return link.clone();
        }
        let (tx, rx) = mpsc::channel(LINK_QUEUE_CAPACITY);
        state.links.insert((from, to), tx.clone());
        tokio::spawn(run_link(self.clone(), from, to, rx));
        tx
    }
}

/// One connection: drains the link's queue frame by frame.
async fn run_link(
    network: InProcNetwork,
    from: NodeId,
    to: NodeId,
    mut rx: mpsc::Receiver<Pending>,
) {
    while let Some(first) = rx.recv().await {
        // Let the other tasks woken in this instant (heartbeats of other groups) queue theirs.
        tokio::task::yield_now().await;
        let mut frame = vec![first];
        while frame.len() < MAX_FRAME_ENVELOPES {
            match rx.try_recv() {
                Ok(p) => frame.push(p),
                Err(_) => break,
            }
        }
        let fate = {
            let mut state = network.state.lock();
            state.stats.frames_sent += 1;
            state.stats.envelopes_sent += frame.len() as u64;
            let fate = state.fate(from, to);
            if fate.is_none() {
                state.stats.frames_lost += 1;
            }
            fate
        };
        // A lost frame drops its reply senders; each caller times out at its own deadline.
        let Some(delay) = fate else { continue };
        tokio::spawn(deliver_frame(network.clone(), from, to, delay, frame));
    }
}

async fn deliver_frame(
    network: InProcNetwork,
    from: NodeId,
    to: NodeId,
    delay: Duration,
    frame: Vec<Pending>,
) {
    tokio::time::sleep(delay).await;
    for pending in frame {
        let router = {
            let state = network.state.lock();
            if !state.reachable(from, to) {
                continue;
            }
            state.routers.get(&to).cloned()
        };
        let Some(router) = router else { continue };
        tokio::spawn(handle_envelope(network.clone(), from, to, router, pending));
    }
}

async fn handle_envelope(
    network: InProcNetwork,
    from: NodeId,
    to: NodeId,
    router: SharedRouter,
    pending: Pending,
) {
    let reply = router.dispatch(pending.envelope).await;
    let fate = {
        let mut state = network.state.lock();
        let fate = state.fate(to, from);
        if fate.is_none() {
            state.stats.replies_lost += 1;
        }
        fate
    };
    let Some(delay) = fate else { return };
    tokio::time::sleep(delay).await;
    if network.state.lock().reachable(to, from) {
        // The caller may have given up already; then nobody wants the reply.
        let _ = pending.reply.send(reply);
    }
}

/// One node's sending side of an [`InProcNetwork`].
#[derive(Clone)]
pub struct InProcTransport {
    network: InProcNetwork,
    node: NodeId,
}

impl Transport for InProcTransport {
    fn local_node(&self) -> NodeId {
        self.node
    }

    async fn call(
        &self,
        envelope: Envelope,
        timeout: Duration,
    ) -> Result<RaftReply, TransportError> {
        let to = envelope.to;
        let deadline = tokio::time::Instant::now() + timeout;
        let timed_out = TransportError::Timeout {
            node: to,
            timeout_ms: timeout.as_millis() as u64,
        };
        let (tx, rx) = oneshot::channel();
        let link = self.network.link(self.node, to);
        if link
            .try_send(Pending {
                envelope,
                reply: tx,
            })
            .is_err()
        {
            return Err(TransportError::QueueFull { node: to });
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_lost)) => {
                tokio::time::sleep_until(deadline).await;
                Err(timed_out)
            }
            Err(_elapsed) => Err(timed_out),
        }
    }
}
