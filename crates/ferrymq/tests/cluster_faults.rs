//! Three real `ferrymq serve` nodes on loopback under load, through network partitions and a
//! rolling restart.
//!
//! - `network_partitions_isolate_a_follower_then_a_leader`: every cluster link goes through a
//!   fault-injecting proxy of the test's own (`common::proxy`), one per ordered pair of nodes, so
//!   each node's `--peers` names proxies for the others. Under load from idempotent publishers
//!   (one per partition, resending an unacknowledged message with the same deduplication id) and
//!   acking consumers (one per node), the test isolates a follower of partition 0 (its links
//!   refused) and heals it, then isolates partition 0's leader (its links silently stalled: the
//!   nodes see no error, only silence) and heals it.
//! - `a_rolling_restart_under_load_loses_nothing`: each node in turn is stopped with SIGTERM,
//!   started again and waited for until it has caught up, under the same load.
//!
//! Checked: publishing goes on on the majority side; the isolated old leader acknowledges
//! nothing (its clients time out or are told `not_leader`) and steps down once healed; the
//! consumers (one per node, of one subscription, which each partition's leader serves) receive
//! a message published after each event (and an isolated node's consumer does not); at the end
//! every acknowledged publish is on every replica at the offset it was acknowledged with, once,
//! and the replicas of every partition are identical. Failover and
//! recovery times are printed (`--nocapture`). Every wait is a bounded poll, every load loop is
//! bounded in count and time, and the two tests run one at a time.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{config, create_topic, free_port, partition_logs, Cluster};
use common::proxy::{LinkState, Mesh};
use ferrymq_client::{Client, ErrorCode, Message, StartPosition, SubscribeOptions};
use tokio::task::JoinHandle;

const TOPIC: &str = "orders";
const PARTITIONS: u32 = 3;
/// Each publisher's most messages, whatever the time: about 100 a second each in a debug build.
const PUBLISHES_MAX: u64 = 20_000;
/// The pause between a publisher's messages, so that the logs stay small enough to compare.
const PUBLISH_PAUSE: Duration = Duration::from_millis(5);
/// The longest a message is resent for: longer than any failover this test allows.
const RESEND_FOR: Duration = Duration::from_secs(30);
/// How long any one state this test waits for may take on a loaded two-core machine.
const STATE_WAIT: Duration = Duration::from_secs(30);

/// Runs `test` on its own runtime, one test at a time: each runs three nodes under load, and two
/// at once on two cores would measure the machine, not the cluster.
fn run(test: impl Future<Output = ()>) {
    static SERIAL: Mutex<()> = Mutex::new(());
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .enable_all()
        .build()
        .unwrap()
        .block_on(test);
}

/// One acknowledged publish.
#[derive(Debug, Clone)]
struct Ack {
    partition: u32,
    offset: u64,
    body: String,
    /// The node that acknowledged it.
    node: u64,
    /// When it was sent, for the last time, and when its acknowledgement came.
    sent: Instant,
    acked: Instant,
}

/// What the publishers did.
#[derive(Default)]
struct Ledger {
    acks: Mutex<Vec<Ack>>,
    /// Attempts that failed: refused, or of unknown outcome.
    failures: Mutex<Vec<(Instant, String)>>,
    /// Messages sent again after a failure, with the same deduplication id.
    resent: AtomicU64,
}

impl Ledger {
    /// The first acknowledgement of a publish to `partition` sent at or after `since` and
    /// acknowledged by another node than `not`.
    fn acked_since(&self, partition: u32, since: Instant, not: Option<u64>) -> Option<Ack> {
        let acks = self.acks.lock().unwrap();
        acks.iter()
            .find(|a| a.partition == partition && a.sent >= since && Some(a.node) != not)
            .cloned()
    }
}

/// Clients that follow the leaders: the nodes' client addresses, tried from a rotating start so
/// that a node cut off from the others (which may still think it leads) is not asked forever.
#[derive(Clone)]
struct Route {
    addrs: Vec<String>,
}

impl Route {
    /// A connection to the leader of `partition` and that leader's id, asked through the node
    /// at `rotation` first.
    async fn leader(&self, rotation: usize, partition: u32) -> Option<(Client, u64)> {
        let mut order = self.addrs.clone();
        let start = rotation % order.len();
        order.rotate_left(start);
        let mut config = config(&order.join(","));
        config.connect_timeout = Duration::from_secs(2);
        config.request_timeout = Some(Duration::from_secs(4));
        let client = Client::connect_leader(config, Some(TOPIC), partition)
            .await
            .ok()?;
        let node = client.cluster_info().await.ok()?.node_id;
        Some((client, node))
    }

    /// Publishes `body` to `partition` (its deduplication id is the body itself), resending it
    /// after each failure until it is acknowledged, `stop` is set or `RESEND_FOR` has passed.
    async fn publish(
        &self,
        session: &mut Session,
        partition: u32,
        body: &str,
        ledger: &Ledger,
        stop: &AtomicBool,
    ) -> Option<Ack> {
        let deadline = Instant::now() + RESEND_FOR;
        let mut sends = 0u32;
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            if session.client.as_ref().is_none_or(|(c, _)| c.is_closed()) {
                session.client = self.leader(session.rotation, partition).await;
                match &session.client {
                    None => {
                        session.rotation += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    // A node that just left a publish unanswered may be a leader cut off from
                    // the others that does not know it yet: ask another node, once.
                    Some((_, node)) if session.avoid.take() == Some(*node) => {
                        session.client = None;
                        session.rotation += 1;
                        continue;
                    }
                    Some(_) => {}
                }
            }
            let (client, node) = session.client.as_ref().unwrap();
            if sends > 0 {
                ledger.resent.fetch_add(1, Ordering::Relaxed);
            }
            sends += 1;
            let sent = Instant::now();
            let message = Message::new(body.as_bytes().to_vec()).with_dedup_id(body);
            match client
                .publish_batch(TOPIC, Some(partition), &[message])
                .await
            {
                Ok(receipt) => {
                    let id = receipt
                        .first_id()
                        .expect("an acknowledged publish has an id");
                    let ack = Ack {
                        partition,
                        offset: id.offset,
                        body: body.to_owned(),
                        node: *node,
                        sent,
                        acked: Instant::now(),
                    };
                    ledger.acks.lock().unwrap().push(ack.clone());
                    return Some(ack);
                }
                Err(e) => {
                    if e.code() != Some(ErrorCode::NotLeader) {
                        session.avoid = Some(*node);
                    }
                    ledger.failures.lock().unwrap().push((sent, e.to_string()));
                    session.client = None;
                    session.rotation += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        None
    }
}

/// One publisher's connection to its partition's leader, and where it asks next.
#[derive(Default)]
struct Session {
    client: Option<(Client, u64)>,
    rotation: usize,
    /// The node whose last answer was no answer (a timeout, an unknown outcome).
    avoid: Option<u64>,
}

/// Publishes `p<partition>-<n>` to `partition`, one at a time, until `stop`.
async fn publisher(route: Route, partition: u32, ledger: Arc<Ledger>, stop: Arc<AtomicBool>) {
    let mut session = Session {
        rotation: partition as usize,
        ..Session::default()
    };
    for n in 0..PUBLISHES_MAX {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let body = format!("p{partition}-{n}");
        route
            .publish(&mut session, partition, &body, &ledger, &stop)
            .await;
        tokio::time::sleep(PUBLISH_PAUSE).await;
    }
}

/// A consumer of the durable subscription `live` on one node only, acking each message and
/// noting its body in `seen`; it reconnects when its connection ends, until `stop`.
async fn consumer(addr: String, seen: Arc<Mutex<HashSet<String>>>, stop: Arc<AtomicBool>) {
    const SESSIONS_MAX: u32 = 1_000;
    const DELIVERIES_MAX: u32 = 1_000_000;
    for _ in 0..SESSIONS_MAX {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut config = config(&addr);
        config.connect_timeout = Duration::from_secs(2);
        let options = SubscribeOptions::new(TOPIC)
            .subscription("live")
            .start(StartPosition::Earliest);
        let subscribed = match Client::connect_with(config).await {
            Ok(client) => client.subscribe(options).await.ok(),
            Err(_) => None,
        };
        let Some(mut subscription) = subscribed else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        for _ in 0..DELIVERIES_MAX {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let next = tokio::time::timeout(Duration::from_millis(500), subscription.next());
            match next.await {
                Err(_idle) => {}
                Ok(Some(Ok(delivery))) => {
                    let body = String::from_utf8_lossy(&delivery.message.body).into_owned();
                    seen.lock().unwrap().insert(body);
                    let _ = subscription.ack(&delivery).await;
                }
                Ok(Some(Err(_)) | None) => break,
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The publishers and consumers running against a cluster.
struct Load {
    route: Route,
    ledger: Arc<Ledger>,
    stop_publishing: Arc<AtomicBool>,
    stop_consuming: Arc<AtomicBool>,
    publishers: Vec<JoinHandle<()>>,
    consumers: Vec<JoinHandle<()>>,
    /// What each node's consumer received, by node index.
    seen: Vec<Arc<Mutex<HashSet<String>>>>,
    /// The test's own publishes: markers and probes.
    session: Session,
}

impl Load {
    fn start(cluster: &Cluster) -> Load {
        let route = Route {
            addrs: cluster.nodes.iter().map(|n| n.tcp.to_string()).collect(),
        };
        let ledger = Arc::new(Ledger::default());
        let stop_publishing = Arc::new(AtomicBool::new(false));
        let stop_consuming = Arc::new(AtomicBool::new(false));
        let publishers = (0..PARTITIONS)
            .map(|p| {
                let (route, ledger) = (route.clone(), ledger.clone());
                tokio::spawn(publisher(route, p, ledger, stop_publishing.clone()))
            })
            .collect();
        let seen: Vec<_> = cluster
            .nodes
            .iter()
            .map(|_| Arc::new(Mutex::new(HashSet::new())))
            .collect();
        let consumers = cluster
            .nodes
            .iter()
            .zip(&seen)
            .map(|(node, seen)| {
                let addr = node.tcp.to_string();
                tokio::spawn(consumer(addr, seen.clone(), stop_consuming.clone()))
            })
            .collect();
        Load {
            route,
            ledger,
            stop_publishing,
            stop_consuming,
            publishers,
            consumers,
            seen,
            session: Session::default(),
        }
    }

    /// Waits until every partition has a publish sent at or after `since` acknowledged, by
    /// another node than `not`; returns how long after `since` each partition's first one was
    /// acknowledged.
    async fn publishing_goes_on(
        &self,
        since: Instant,
        not: Option<u64>,
        what: &str,
    ) -> Vec<Duration> {
        let deadline = Instant::now() + STATE_WAIT;
        loop {
            let firsts: Vec<Option<Ack>> = (0..PARTITIONS)
                .map(|p| self.ledger.acked_since(p, since, not))
                .collect();
            if firsts.iter().all(Option::is_some) {
                return firsts
                    .into_iter()
                    .map(|a| a.unwrap().acked.duration_since(since))
                    .collect();
            }
            assert!(
                Instant::now() < deadline,
                "{what}: publishing stopped: acknowledged since: {firsts:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Publishes `mark-<event>-<p>` to every partition and waits until the consumers of the
    /// nodes at `live` have received all of them between them: the subscription is served
    /// there. Returns how long it took.
    async fn mark(&mut self, event: &str, live: &[usize]) -> Duration {
        let started = Instant::now();
        let never = AtomicBool::new(false);
        let bodies: Vec<String> = (0..PARTITIONS)
            .map(|p| format!("mark-{event}-{p}"))
            .collect();
        for (p, body) in bodies.iter().enumerate() {
            let route = self.route.clone();
            let acked = route
                .publish(&mut self.session, p as u32, body, &self.ledger, &never)
                .await;
            assert!(acked.is_some(), "{event}: {body} was never acknowledged");
        }
        // Each partition is delivered by its leader alone: the consumers of `live` together
        // receive every marker.
        let deadline = Instant::now() + STATE_WAIT;
        loop {
            let missing: Vec<&String> = bodies
                .iter()
                .filter(|b| {
                    !live
                        .iter()
                        .any(|&i| self.seen[i].lock().unwrap().contains(*b))
                })
                .collect();
            if missing.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{event}: the consumers on nodes {live:?} never received {missing:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        started.elapsed()
    }

    /// Whether the consumer of node `index` has received any of `event`'s markers.
    fn saw_mark(&self, index: usize, event: &str) -> bool {
        let prefix = format!("mark-{event}-");
        let seen = self.seen[index].lock().unwrap();
        seen.iter().any(|b| b.starts_with(&prefix))
    }

    async fn stop_publishers(&mut self) {
        self.stop_publishing.store(true, Ordering::Relaxed);
        for task in self.publishers.drain(..) {
            tokio::time::timeout(RESEND_FOR + STATE_WAIT, task)
                .await
                .expect("a publisher stops within its resend bound")
                .unwrap();
        }
    }

    async fn stop_consumers(&mut self) {
        self.stop_consuming.store(true, Ordering::Relaxed);
        for task in self.consumers.drain(..) {
            tokio::time::timeout(STATE_WAIT, task)
                .await
                .expect("a consumer stops within a poll")
                .unwrap();
        }
    }
}

/// The leader of each partition as node `index` sees it (0: unknown).
async fn leaders_seen_by(cluster: &Cluster, index: usize) -> Option<Vec<u64>> {
    let mut config = config(&cluster.nodes[index].tcp.to_string());
    config.connect_timeout = Duration::from_secs(2);
    config.request_timeout = Some(Duration::from_secs(2));
    let client = Client::connect_with(config).await.ok()?;
    let info = client.cluster_info().await.ok()?;
    let _ = client.close().await;
    let mut leaders = vec![0; PARTITIONS as usize];
    for p in info.partitions.iter().filter(|p| p.topic == TOPIC) {
        leaders[p.partition as usize] = p.leader;
    }
    Some(leaders)
}

/// Waits until the nodes at `indexes` agree on a leader for every partition, none of them
/// `not`; returns the leaders.
async fn agreed_leaders(cluster: &Cluster, indexes: &[usize], not: Option<u64>) -> Vec<u64> {
    let deadline = Instant::now() + STATE_WAIT;
    loop {
        let mut views = Vec::new();
        for &i in indexes {
            views.push(leaders_seen_by(cluster, i).await);
        }
        let first = views[0].clone();
        let agreed = first.as_ref().is_some_and(|leaders| {
            leaders.iter().all(|l| *l != 0 && Some(*l) != not)
                && views.iter().all(|v| v.as_ref() == Some(leaders))
        });
        if agreed {
            return first.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "nodes {indexes:?} never agreed on leaders (not {not:?}): {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a client that stays on one node got from it while it was cut off.
#[derive(Debug, Default)]
struct Probe {
    acknowledged: Vec<String>,
    not_leader: u64,
    timed_out: u64,
    other: Vec<String>,
}

/// Publishes `probe-<n>-<p>` to every partition through the node at `addr` alone, one at a
/// time, until `stop`.
async fn probe_through(addr: String, stop: Arc<AtomicBool>) -> Probe {
    const PROBES_MAX: u32 = 1_000;
    let mut probe = Probe::default();
    let mut config = config(&addr);
    config.connect_timeout = Duration::from_secs(2);
    config.request_timeout = Some(Duration::from_secs(2));
    let mut client = None;
    for n in 0..PROBES_MAX {
        for p in 0..PARTITIONS {
            if stop.load(Ordering::Relaxed) {
                return probe;
            }
            if client.as_ref().is_none_or(Client::is_closed) {
                client = Client::connect_with(config.clone()).await.ok();
            }
            let Some(c) = client.as_ref() else {
                probe.other.push("cannot connect".into());
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let body = format!("probe-{n}-{p}");
            let message = Message::new(body.clone().into_bytes()).with_dedup_id(&body);
            match c.publish_batch(TOPIC, Some(p), &[message]).await {
                Ok(_) => probe.acknowledged.push(body),
                Err(e) if e.code() == Some(ErrorCode::NotLeader) => probe.not_leader += 1,
                Err(ferrymq_client::Error::Timeout(_)) => probe.timed_out += 1,
                // The server's own write timeout: the outcome is unknown, nothing acknowledged.
                Err(e) if e.to_string().contains("may or may not") => probe.timed_out += 1,
                Err(e) => probe.other.push(e.to_string()),
            }
            if client.as_ref().is_some_and(Client::is_closed) {
                client = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    probe
}

/// Three nodes whose every cluster link goes through a proxy of `Mesh`, started and serving.
async fn proxied_cluster(name: &str) -> (Cluster, Mesh) {
    let mut cluster = Cluster::plan(name, 3);
    let nodes: Vec<_> = cluster.nodes.iter().map(|n| (n.id, n.cluster)).collect();
    let mesh = Mesh::start(&nodes, free_port).await;
    for node in &mut cluster.nodes {
        node.peers = mesh.peers_of(node.id, node.cluster);
    }
    tokio::task::block_in_place(|| cluster.boot_all());
    (cluster, mesh)
}

const ALL: [usize; 3] = [0, 1, 2];

fn others(index: usize) -> Vec<usize> {
    ALL.into_iter().filter(|i| *i != index).collect()
}

/// Cuts a follower of partition 0 (the one leading the fewest partitions) off from the others,
/// its links refused; publishing goes on; once healed it catches up.
async fn isolate_a_follower(cluster: &Cluster, mesh: &Mesh, load: &mut Load) {
    let leaders = agreed_leaders(cluster, &ALL, None).await;
    let led = |id: u64| leaders.iter().filter(|l| **l == id).count();
    let follower = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|id| *id != leaders[0])
        .min_by_key(|id| led(*id))
        .unwrap();
    let index = cluster.index_of(follower);
    mesh.isolate(follower, LinkState::Refused);
    let cut = Instant::now();
    let going_on = load.publishing_goes_on(cut, None, "follower cut off").await;
    load.mark("follower-cut", &others(index)).await;
    assert!(
        !load.saw_mark(index, "follower-cut"),
        "node {follower}, cut off, delivered a message committed without it"
    );
    mesh.heal();
    let healed = Instant::now();
    load.mark("follower-healed", &ALL).await;
    eprintln!(
        "follower {follower} (leading {} of {PARTITIONS} partitions; leaders {leaders:?}) cut off: \
         first acknowledgement per partition after {going_on:?}; healed, caught up after {:?}",
        led(follower),
        healed.elapsed()
    );
}

/// Cuts the leader of partition 0 off from the others, its links silently stalled: the
/// majority elects another and acknowledges publishes, the old leader acknowledges nothing;
/// once healed it steps down and catches up.
async fn isolate_the_leader(cluster: &Cluster, mesh: &Mesh, load: &mut Load) {
    let leaders = agreed_leaders(cluster, &ALL, None).await;
    let old = leaders[0];
    let index = cluster.index_of(old);
    let majority = others(index);
    mesh.isolate(old, LinkState::Stalled);
    let cut = Instant::now();
    let stop_probe = Arc::new(AtomicBool::new(false));
    let addr = cluster.nodes[index].tcp.to_string();
    let probe = tokio::spawn(probe_through(addr, stop_probe.clone()));
    let new_leaders = agreed_leaders(cluster, &majority, Some(old)).await;
    let elected = cut.elapsed();
    let failover = load
        .publishing_goes_on(cut, Some(old), "leader cut off")
        .await;
    load.mark("leader-cut", &majority).await;
    assert!(
        !load.saw_mark(index, "leader-cut"),
        "node {old}, cut off, delivered a message committed without it"
    );
    stop_probe.store(true, Ordering::Relaxed);
    let probe = tokio::time::timeout(STATE_WAIT, probe)
        .await
        .unwrap()
        .unwrap();
    mesh.heal();
    let healed = Instant::now();
    agreed_leaders(cluster, &ALL, None).await;
    let stepped_down = healed.elapsed();
    load.mark("leader-healed", &ALL).await;
    let caught_up = healed.elapsed();
    eprintln!(
        "leader {old} of partition 0 (leaders {leaders:?}) cut off: the others agree on new \
         leaders {new_leaders:?} after {elected:?}; first acknowledgement per partition by \
         another node after {failover:?} (a publisher waiting on the old leader gives up after \
         4 s); healed, \
         it follows after {stepped_down:?}, caught up after {caught_up:?}; through it meanwhile: \
         {} not_leader, {} timed out, other errors {:?}",
        probe.not_leader, probe.timed_out, probe.other
    );
    assert!(
        probe.acknowledged.is_empty(),
        "node {old}, cut off, acknowledged {:?}",
        probe.acknowledged
    );
    assert!(probe.not_leader + probe.timed_out > 0, "{probe:?}");
    let acks = load.ledger.acks.lock().unwrap().clone();
    let by_old: Vec<&Ack> = acks
        .iter()
        .filter(|a| a.node == old && a.sent >= cut && a.sent < healed)
        .collect();
    assert!(
        by_old.is_empty(),
        "node {old}, cut off, acknowledged {by_old:?}"
    );
}

/// What is wrong with the replicas, if anything: `logs[node][partition]` must be the same on
/// every node, hold every acknowledged publish at the offset it was acknowledged with, and hold
/// nothing that was never sent (no probe of a cut-off leader, in particular).
fn replica_problem(logs: &[Vec<Vec<String>>], acks: &[Ack]) -> Option<String> {
    for p in 0..PARTITIONS as usize {
        for (i, log) in logs.iter().enumerate().skip(1) {
            if log[p] != logs[0][p] {
                let at = (0..).find(|&o| log[p].get(o) != logs[0][p].get(o)).unwrap();
                return Some(format!(
                    "partition {p}: node {} holds {} messages, node 1 {}; first difference at \
                     offset {at}: {:?} against {:?}",
                    i + 1,
                    log[p].len(),
                    logs[0][p].len(),
                    log[p].get(at),
                    logs[0][p].get(at)
                ));
            }
        }
    }
    for ack in acks {
        let stored = logs[0][ack.partition as usize].get(ack.offset as usize);
        if stored != Some(&ack.body) {
            return Some(format!(
                "{ack:?} was acknowledged, the replicas hold {stored:?} at its offset"
            ));
        }
    }
    for (p, log) in logs[0].iter().enumerate() {
        let publisher = format!("p{p}-");
        // A probe sent through the cut-off node to a partition it does not lead is passed on
        // to that partition's leader over the stalled link: its client gives up (the outcome
        // unknown, nothing acknowledged), and it may land once the link heals, once (its
        // dedup id), in the partition it named.
        let probe = format!("-{p}");
        let explained = |b: &String| {
            b.starts_with(&publisher)
                || b.starts_with("mark-")
                || (b.starts_with("probe-") && b.ends_with(&probe))
        };
        if let Some(body) = log.iter().find(|b| !explained(b)) {
            return Some(format!(
                "partition {p} holds {body:?}, never acknowledged there"
            ));
        }
        let mut probes: Vec<&String> = log.iter().filter(|b| b.starts_with("probe-")).collect();
        let stored = probes.len();
        probes.sort();
        probes.dedup();
        if probes.len() != stored {
            return Some(format!("partition {p} holds a probe twice: {log:?}"));
        }
    }
    None
}

/// Stops the load and waits (bounded) until every replica is identical and holds every
/// acknowledged publish where it was acknowledged; prints what the publishers did.
async fn check_replicas(cluster: &mut Cluster, load: &mut Load) {
    load.stop_publishers().await;
    let acks = load.ledger.acks.lock().unwrap().clone();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    let logs = loop {
        let logs =
            tokio::task::block_in_place(|| partition_logs(&cluster.nodes, TOPIC, PARTITIONS));
        match replica_problem(&logs, &acks) {
            None => break logs,
            Some(problem) => assert!(
                Instant::now() < deadline,
                "{problem}\nthe nodes logged:\n{}",
                cluster.warnings()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Every publish carries a deduplication id: a message resent after an unknown outcome is
    // recognised by whichever leader gets it, and stored once.
    let mut stored: BTreeMap<&str, usize> = BTreeMap::new();
    for body in logs[0].iter().flatten() {
        *stored.entry(body).or_default() += 1;
    }
    let twice: Vec<&&str> = stored.keys().filter(|b| stored[**b] > 1).collect();
    let duplicates = twice.len();
    assert!(twice.is_empty(), "stored more than once: {twice:?}");
    let failures = load.ledger.failures.lock().unwrap().len();
    eprintln!(
        "{} acknowledged, all on every replica at their offsets; {} stored per replica, {} of \
         them more than once; {failures} failed attempts, {} resends; replicas identical {:?} \
         after the load stopped",
        acks.len(),
        logs[0].iter().map(Vec::len).sum::<usize>(),
        duplicates,
        load.ledger.resent.load(Ordering::Relaxed),
        started.elapsed()
    );
    load.stop_consumers().await;
}

#[test]
fn network_partitions_isolate_a_follower_then_a_leader() {
    run(async {
        let began = Instant::now();
        let (mut cluster, mesh) = proxied_cluster("cluster-partitions").await;
        create_topic(&cluster.addrs(), TOPIC, PARTITIONS).await;
        let mut load = Load::start(&cluster);
        load.publishing_goes_on(Instant::now(), None, "start").await;
        isolate_a_follower(&cluster, &mesh, &mut load).await;
        isolate_the_leader(&cluster, &mesh, &mut load).await;
        check_replicas(&mut cluster, &mut load).await;
        eprintln!("network partitions: {:?} in all", began.elapsed());
    });
}

/// Stops node `index` with SIGTERM, waits until publishing goes on without it, starts it again
/// and waits until its consumer receives what was published after: it rejoined and caught up.
async fn restart(cluster: &mut Cluster, load: &mut Load, index: usize) {
    let id = cluster.nodes[index].id;
    let leaders = agreed_leaders(cluster, &ALL, None).await;
    let stopping = Instant::now();
    tokio::task::block_in_place(|| cluster.stop(index));
    let stopped = stopping.elapsed();
    let going_on = load
        .publishing_goes_on(stopping, Some(id), "node stopped")
        .await;
    let starting = Instant::now();
    tokio::task::block_in_place(|| {
        cluster.boot(index);
        cluster.wait_serving(index);
    });
    let serving = starting.elapsed();
    load.mark(&format!("restarted-{id}"), &ALL).await;
    eprintln!(
        "node {id} (leaders {leaders:?}): SIGTERM to exit {stopped:?}; first acknowledgement per \
         partition by another node {going_on:?} after the SIGTERM; started, serving after \
         {serving:?}, caught up after {:?}",
        starting.elapsed()
    );
}

#[test]
fn a_rolling_restart_under_load_loses_nothing() {
    run(async {
        let began = Instant::now();
        let mut cluster = tokio::task::block_in_place(|| Cluster::start("cluster-rolling", 3));
        create_topic(&cluster.addrs(), TOPIC, PARTITIONS).await;
        let mut load = Load::start(&cluster);
        load.publishing_goes_on(Instant::now(), None, "start").await;
        for index in ALL {
            restart(&mut cluster, &mut load, index).await;
        }
        let restarted = Instant::now();
        agreed_leaders(&cluster, &ALL, None).await;
        load.stop_publishers().await;
        // Every publish after the restarts works, the first time.
        let never = AtomicBool::new(false);
        for p in 0..PARTITIONS {
            let mut session = Session::default();
            for n in 0..20 {
                let body = format!("p{p}-after-{n}");
                let route = load.route.clone();
                let ack = route
                    .publish(&mut session, p, &body, &load.ledger, &never)
                    .await;
                assert!(ack.is_some(), "{body} was not acknowledged");
            }
        }
        let failures: Vec<(Instant, String)> = load.ledger.failures.lock().unwrap().clone();
        let after: Vec<&String> = failures
            .iter()
            .filter(|(sent, _)| *sent >= restarted)
            .map(|(_, e)| e)
            .collect();
        assert!(
            after.is_empty(),
            "publishes failed after the restarts: {after:?}"
        );
        check_replicas(&mut cluster, &mut load).await;
        eprintln!("rolling restart: {:?} in all", began.elapsed());
    });
}
