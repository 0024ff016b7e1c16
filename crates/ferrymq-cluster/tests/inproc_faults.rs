//! The in-process network's faults behave as documented: a lost message is a timeout at the
//! deadline, partitions and down nodes cut traffic until healed, and a seed fixes the faults.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ferrymq_cluster::inproc::{FaultConfig, InProcNetwork};
use ferrymq_cluster::transport::{Envelope, GroupRouter, RaftRpc, Transport, TransportError};
use ferrymq_cluster::{GroupId, NodeId};
use openraft::raft::VoteRequest;
use openraft::{LogId, Vote};

const TIMEOUT: Duration = Duration::from_millis(200);

fn vote(from: NodeId, to: NodeId) -> Envelope {
    Envelope {
        group: GroupId(7),
        from,
        to,
        rpc: RaftRpc::Vote(VoteRequest::new(Vote::new(1, from), None::<LogId<NodeId>>)),
    }
}

/// Two nodes, neither running group 7: a delivered call comes back as `NoSuchGroup`.
fn network(seed: u64, faults: FaultConfig) -> InProcNetwork {
    let net = InProcNetwork::new(seed, faults);
    for id in [1, 2, 3] {
        net.attach(id, Arc::new(GroupRouter::default()));
    }
    net
}

async fn call(net: &InProcNetwork, from: NodeId, to: NodeId) -> (Result<(), TransportError>, u128) {
    let start = tokio::time::Instant::now();
    let result = net
        .transport(from)
        .call(vote(from, to), TIMEOUT)
        .await
        .map(|_| ());
    (result, start.elapsed().as_millis())
}

fn delivered(result: &Result<(), TransportError>) -> bool {
    matches!(result, Err(TransportError::NoSuchGroup { .. }))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn partitions_and_down_nodes_cut_traffic_until_healed() {
    let net = network(1, FaultConfig::default());
    assert!(delivered(&call(&net, 1, 2).await.0));
    net.partition(&[BTreeSet::from([1])]);
    let (cut, waited_ms) = call(&net, 1, 2).await;
    assert!(matches!(cut, Err(TransportError::Timeout { node: 2, .. })));
    assert_eq!(
        waited_ms,
        TIMEOUT.as_millis(),
        "a lost message times out at the deadline"
    );
    assert!(
        delivered(&call(&net, 2, 3).await.0),
        "the other side still talks"
    );
    net.heal();
    assert!(delivered(&call(&net, 1, 2).await.0));
    net.set_down(3, true);
    assert!(matches!(
        call(&net, 1, 3).await.0,
        Err(TransportError::Timeout { .. })
    ));
    net.set_down(3, false);
    assert!(delivered(&call(&net, 1, 3).await.0));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn loss_and_delay_follow_the_seed() {
    let faults = FaultConfig {
        loss_per_million: 300_000,
        min_delay_ms: 1,
        max_delay_ms: 40,
    };
    let outcomes = |seed| async move {
        let net = network(seed, faults);
        let mut seen = Vec::new();
        for _ in 0..40 {
            let (result, waited_ms) = call(&net, 1, 2).await;
            seen.push((delivered(&result), waited_ms));
        }
        seen
    };
    let first = outcomes(9).await;
    assert_eq!(first, outcomes(9).await, "one seed, one sequence of faults");
    assert_ne!(first, outcomes(10).await);
    let lost = first.iter().filter(|(ok, _)| !ok).count();
    assert!((3..=30).contains(&lost), "{lost} of 40 lost at 30% per hop");
    assert!(first
        .iter()
        .filter(|(ok, _)| *ok)
        .all(|&(_, ms)| (2..=80).contains(&ms)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_full_link_refuses_instead_of_growing() {
    use ferrymq_cluster::inproc::LINK_QUEUE_CAPACITY;
    let net = network(1, FaultConfig::default());
    // Every call task runs up to its queueing before the link's task (spawned by the first
    // call, so queued behind them all) takes anything off the queue.
    let calls: Vec<_> = (0..LINK_QUEUE_CAPACITY + 10)
        .map(|_| {
            let transport = net.transport(1);
            tokio::spawn(async move { transport.call(vote(1, 2), TIMEOUT).await })
        })
        .collect();
    let mut full = 0;
    for call in calls {
        if matches!(
            call.await.unwrap(),
            Err(TransportError::QueueFull { node: 2 })
        ) {
            full += 1;
        }
    }
    assert_eq!(full, 10);
}
