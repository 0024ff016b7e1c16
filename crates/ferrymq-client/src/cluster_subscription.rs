//! A subscription across the nodes of a cluster.
//!
//! In a cluster only a partition's leader delivers its messages and takes their acks, and
//! leaders move when nodes fail. A [`ClusterSubscription`] attaches the same subscription on
//! every node (each serves the partitions it leads, the others hold the subscription without
//! delivering), merges what they deliver, and sends each ack, nack or release to the node that
//! delivered the message. A node whose connection breaks is connected to again, with backoff,
//! and its subscription attached again; the cursor it resumes from is the one the partition's
//! group replicated, so nothing acked with confirmation comes again.
//!
//! Each node's [`Subscription`] is owned by one task, which takes deliveries from it and
//! carries out the commands sent to it, so a slow node never holds up another.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use ferrymq_protocol::{Delivery, DeliveryBatch, OffsetRange};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::{Client, SubscribeOptions, Subscription};

/// Deliveries waiting in the merge, in DELIVER frames: each node's credit window bounds the
/// rest.
const MERGED_BATCHES: usize = 64;
/// Backoff between attempts to attach to a node again: doubling from the first to the last.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// What a node's task is asked to do with its subscription.
enum Command {
    Ack {
        ranges: Vec<OffsetRange>,
        result: Option<Bytes>,
        confirm: bool,
        reply: oneshot::Sender<Result<()>>,
    },
    Nack {
        ranges: Vec<OffsetRange>,
        delay: Duration,
        release: bool,
        reply: oneshot::Sender<Result<()>>,
    },
    Close {
        unprocessed: Vec<OffsetRange>,
        reply: oneshot::Sender<Result<u64>>,
    },
}

/// One subscription attached on every node of a cluster (see the module's documentation).
pub struct ClusterSubscription {
    topic: String,
    merged: mpsc::Receiver<(usize, Result<DeliveryBatch>)>,
    nodes: Vec<mpsc::Sender<Command>>,
    tasks: Vec<JoinHandle<()>>,
    /// The node that last delivered each partition: where its acks go.
    owners: HashMap<u32, usize>,
    /// Taken from a batch by [`ClusterSubscription::next`] and not handed out yet.
    buffered: std::collections::VecDeque<Delivery>,
}

impl std::fmt::Debug for ClusterSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSubscription")
            .field("topic", &self.topic)
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl Client {
    /// Attaches `options`' subscription on every node of the cluster that `config.addr` leads to
    /// (see [`ClusterSubscription`]). A broker that runs alone is one node: the subscription is
    /// then attached there alone. The first attachment is made before this returns, so a refused
    /// subscription (a wrong name, a missing grant) is an error here.
    pub async fn subscribe_cluster(
        config: ClientConfig,
        options: SubscribeOptions,
    ) -> Result<ClusterSubscription> {
        let seed = Client::connect_with(config.clone()).await?;
        let info = seed.cluster_info().await?;
        let mut addrs: Vec<String> = info
            .nodes
            .iter()
            .filter(|n| !n.addr.is_empty())
            .map(|n| n.addr.clone())
            .collect();
        if info.node_id == 0 || addrs.is_empty() {
            addrs = vec![seed.config().addr.clone()];
        }
        let _ = seed.close().await;
        let (sender, merged) = mpsc::channel(MERGED_BATCHES);
        let mut nodes = Vec::with_capacity(addrs.len());
        let mut tasks = Vec::with_capacity(addrs.len());
        let mut attached = Vec::new();
        for (index, addr) in addrs.into_iter().enumerate() {
            let mut node_config = config.clone();
            node_config.addr = addr;
            // Attached here, once, so that a refusal is the caller's error; a node that cannot
            // be reached now is retried by its task.
            let first = attach(&node_config, &options).await;
            match first {
                Err(e) if !e.is_connection_error() => return Err(e),
                Ok(_) => attached.push(index),
                Err(_) => {}
            }
            let (commands, inbox) = mpsc::channel(16);
            let node = NodeTask {
                index,
                config: node_config,
                options: options.clone(),
                merged: sender.clone(),
                inbox,
            };
            tasks.push(tokio::spawn(node.run(first.ok())));
            nodes.push(commands);
        }
        if attached.is_empty() {
            for task in &tasks {
                task.abort();
            }
            return Err(Error::ConnectionClosed);
        }
        Ok(ClusterSubscription {
            topic: options.topic.clone(),
            merged,
            nodes,
            tasks,
            owners: HashMap::new(),
            buffered: Default::default(),
        })
    }
}

/// Connects to one node and attaches the subscription there.
async fn attach(
    config: &ClientConfig,
    options: &SubscribeOptions,
) -> Result<(Client, Subscription)> {
    let client = Client::connect_one(config.clone()).await?;
    let subscription = client.subscribe(options.clone()).await?;
    Ok((client, subscription))
}

/// The task that owns one node's subscription.
struct NodeTask {
    index: usize,
    config: ClientConfig,
    options: SubscribeOptions,
    merged: mpsc::Sender<(usize, Result<DeliveryBatch>)>,
    inbox: mpsc::Receiver<Command>,
}

impl NodeTask {
    /// Attaches (again) until the consumer goes away, passing deliveries on and carrying out
    /// commands.
    async fn run(mut self, mut attached: Option<(Client, Subscription)>) {
        let mut backoff = RETRY_FIRST;
        loop {
            let (client, subscription) = match attached.take() {
                Some(pair) => pair,
                None => match attach(&self.config, &self.options).await {
                    Ok(pair) => pair,
                    Err(e) if e.is_connection_error() => {
                        if !self.wait_or_refuse(backoff).await {
                            return;
                        }
                        backoff = (backoff * 2).min(RETRY_MAX);
                        continue;
                    }
                    Err(e) => {
                        // Refused (a deleted topic, a revoked grant): the consumer hears it.
                        let _ = self.merged.send((self.index, Err(e))).await;
                        if !self.wait_or_refuse(RETRY_MAX).await {
                            return;
                        }
                        continue;
                    }
                },
            };
            backoff = RETRY_FIRST;
            let done = self.serve(subscription).await;
            let _ = client.close().await;
            if done {
                return;
            }
        }
    }

    /// Waits `delay` before the next attempt, answering commands meanwhile with the connection
    /// error they would meet. False once the consumer is gone.
    async fn wait_or_refuse(&mut self, delay: Duration) -> bool {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => return !self.merged.is_closed(),
                command = self.inbox.recv() => match command {
                    None => return false,
                    Some(Command::Close { reply, .. }) => {
                        // Nothing attached here, nothing to release.
                        let _ = reply.send(Ok(0));
                        return false;
                    }
                    Some(command) => refuse(command),
                },
            }
        }
    }

    /// Passes deliveries on and carries out commands until the connection ends (false) or the
    /// consumer closes or goes away (true).
    async fn serve(&mut self, mut subscription: Subscription) -> bool {
        loop {
            tokio::select! {
                batch = subscription.next_batch() => match batch {
                    Some(Ok(batch)) => {
                        if self.merged.send((self.index, Ok(batch))).await.is_err() {
                            return true;
                        }
                    }
                    Some(Err(e)) if e.is_connection_error() => return false,
                    Some(Err(e)) => {
                        if self.merged.send((self.index, Err(e))).await.is_err() {
                            return true;
                        }
                    }
                    None => return false,
                },
                command = self.inbox.recv() => match command {
                    None => {
                        let _ = subscription.close().await;
                        return true;
                    }
                    Some(Command::Close { unprocessed, reply }) => {
                        let _ = reply.send(subscription.close_releasing(&unprocessed).await);
                        return true;
                    }
                    Some(command) => carry_out(&subscription, command).await,
                },
            }
        }
    }
}

/// Carries out an ack or a nack on `subscription`, answering the caller.
async fn carry_out(subscription: &Subscription, command: Command) {
    match command {
        Command::Ack {
            ranges,
            result,
            confirm,
            reply,
        } => {
            let answer = match (result, confirm) {
                (Some(result), _) => subscription.ack_ranges_with_result(&ranges, result).await,
                (None, true) => subscription.ack_confirmed(&ranges).await,
                (None, false) => subscription.ack_ranges(&ranges).await,
            };
            let _ = reply.send(answer);
        }
        Command::Nack {
            ranges,
            delay,
            release,
            reply,
        } => {
            let answer = if release {
                let delay_ms = u32::try_from(delay.as_millis()).unwrap_or(u32::MAX);
                subscription.release_ranges_after(&ranges, delay_ms).await
            } else {
                subscription.nack_ranges(&ranges, delay).await
            };
            let _ = reply.send(answer);
        }
        Command::Close { reply, .. } => {
            let _ = reply.send(Err(Error::ConnectionClosed));
        }
    }
}

/// Answers a command while its node is not attached: its deliveries are void (the partition's
/// leader delivers them again).
fn refuse(command: Command) {
    match command {
        Command::Ack { reply, .. } | Command::Nack { reply, .. } => {
            let _ = reply.send(Err(Error::ConnectionClosed));
        }
        Command::Close { reply, .. } => {
            let _ = reply.send(Ok(0));
        }
    }
}

impl ClusterSubscription {
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// How many nodes the subscription is attached on (or being attached again).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The deliveries of the next DELIVER frame any node sent; `None` once every node's task
    /// ended. Cancel-safe.
    pub async fn next_batch(&mut self) -> Option<Result<DeliveryBatch>> {
        if !self.buffered.is_empty() {
            let rest: Vec<Delivery> = self.buffered.drain(..).collect();
            return Some(DeliveryBatch::from_deliveries(&rest).map_err(Error::from));
        }
        let (node, batch) = self.merged.recv().await?;
        if let Ok(batch) = &batch {
            for delivery in batch.iter() {
                self.owners.insert(delivery.partition, node);
            }
        }
        Some(batch)
    }

    /// The next delivery of any node; `None` once every node's task ended. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Delivery>> {
        loop {
            if let Some(delivery) = self.buffered.pop_front() {
                return Some(Ok(delivery));
            }
            match self.next_batch().await? {
                Ok(batch) => self.buffered.extend(batch.iter()),
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// `ranges` split by the node that delivered each partition.
    fn by_node(&self, ranges: &[OffsetRange]) -> Result<Vec<(usize, Vec<OffsetRange>)>> {
        let mut split: Vec<(usize, Vec<OffsetRange>)> = Vec::new();
        for range in ranges {
            let node = *self.owners.get(&range.partition).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "partition {} delivered nothing to this subscription",
                    range.partition
                ))
            })?;
            match split.iter_mut().find(|(n, _)| *n == node) {
                Some((_, list)) => list.push(*range),
                None => split.push((node, vec![*range])),
            }
        }
        Ok(split)
    }

    /// Sends one command per node that delivered part of `ranges` and waits for every answer;
    /// the first error is returned.
    async fn each_node(
        &self,
        ranges: &[OffsetRange],
        command: impl Fn(Vec<OffsetRange>, oneshot::Sender<Result<()>>) -> Command,
    ) -> Result<()> {
        let mut answers = Vec::new();
        for (node, part) in self.by_node(ranges)? {
            let (reply, answer) = oneshot::channel();
            self.nodes[node]
                .send(command(part, reply))
                .await
                .map_err(|_| Error::ConnectionClosed)?;
            answers.push(answer);
        }
        let mut first_error = None;
        for answer in answers {
            let outcome = answer.await.unwrap_or(Err(Error::ConnectionClosed));
            if let Err(e) = outcome {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Acks one delivery (queued; see [`Subscription::ack`]).
    pub async fn ack(&self, delivery: &Delivery) -> Result<()> {
        self.ack_ranges(&[OffsetRange::single(delivery.partition, delivery.offset)])
            .await
    }

    /// Acks runs of offsets, each at the node that delivered it (queued).
    pub async fn ack_ranges(&self, ranges: &[OffsetRange]) -> Result<()> {
        self.each_node(ranges, |ranges, reply| Command::Ack {
            ranges,
            result: None,
            confirm: false,
            reply,
        })
        .await
    }

    /// Acks runs of offsets and waits for each node's answer: `Ok` once the ack is committed
    /// through the partition's group (see [`Subscription::ack_confirmed`]); an acked message is
    /// then never delivered again, not even by the next leader after a failover.
    pub async fn ack_confirmed(&self, ranges: &[OffsetRange]) -> Result<()> {
        self.each_node(ranges, |ranges, reply| Command::Ack {
            ranges,
            result: None,
            confirm: true,
            reply,
        })
        .await
    }

    /// [`ClusterSubscription::ack_confirmed`] with a result kept with each acked message.
    pub async fn ack_ranges_with_result(
        &self,
        ranges: &[OffsetRange],
        result: impl Into<Bytes>,
    ) -> Result<()> {
        let result = result.into();
        self.each_node(ranges, |ranges, reply| Command::Ack {
            ranges,
            result: Some(result.clone()),
            confirm: true,
            reply,
        })
        .await
    }

    /// Gives deliveries back for redelivery after `delay` (counted as an attempt).
    pub async fn nack_ranges(&self, ranges: &[OffsetRange], delay: Duration) -> Result<()> {
        self.each_node(ranges, |ranges, reply| Command::Nack {
            ranges,
            delay,
            release: false,
            reply,
        })
        .await
    }

    /// Gives a delivery back for redelivery after `delay` (counted as an attempt).
    pub async fn nack(&self, delivery: &Delivery, delay: Duration) -> Result<()> {
        self.nack_ranges(
            &[OffsetRange::single(delivery.partition, delivery.offset)],
            delay,
        )
        .await
    }

    /// Gives deliveries back unprocessed, not counted as an attempt.
    pub async fn release_ranges(&self, ranges: &[OffsetRange]) -> Result<()> {
        self.each_node(ranges, |ranges, reply| Command::Nack {
            ranges,
            delay: Duration::ZERO,
            release: true,
            reply,
        })
        .await
    }

    /// Unsubscribes on every node, first releasing `unprocessed` and whatever arrived but was
    /// never taken (see [`Subscription::close_releasing`]). Returns how many were released.
    pub async fn close_releasing(mut self, unprocessed: &[OffsetRange]) -> Result<u64> {
        let mut ranges = unprocessed.to_vec();
        for delivery in self.buffered.drain(..) {
            crate::push_offset(&mut ranges, delivery.partition, delivery.offset);
        }
        let mut per_node: Vec<Vec<OffsetRange>> = vec![Vec::new(); self.nodes.len()];
        for range in ranges {
            if let Some(&node) = self.owners.get(&range.partition) {
                per_node[node].push(range);
            }
        }
        let mut released = 0;
        let mut first_error = None;
        for (node, unprocessed) in self.nodes.iter().zip(per_node) {
            let (reply, answer) = oneshot::channel();
            if node
                .send(Command::Close { unprocessed, reply })
                .await
                .is_err()
            {
                continue;
            }
            match answer.await {
                Ok(Ok(n)) => released += n,
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {}
            }
        }
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        first_error.map_or(Ok(released), Err)
    }

    /// Unsubscribes on every node.
    pub async fn close(self) -> Result<()> {
        self.close_releasing(&[]).await.map(|_| ())
    }
}

impl Drop for ClusterSubscription {
    fn drop(&mut self) {
        // Closing the command channels ends each task, which unsubscribes on its node.
        self.nodes.clear();
    }
}
