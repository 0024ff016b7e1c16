//! Publishes to one partition folded into one Raft entry.
//!
//! Every Raft entry costs the same whatever it carries: an encoding, a row in each replica's
//! log, an apply, a reply. So the parts of publishes waiting for the same partition group go
//! as one entry ([`Folds::append`]): each group has a task that takes every part queued since
//! its last entry (up to [`FOLD_RECORDS_MAX`] records and [`FOLD_BYTES_MAX`] bytes), joins
//! their records in queue order into one batch, and hands it to the group; each part then gets
//! the offsets of its own records within the batch's. While [`IN_FLIGHT_MAX`] entries are being
//! committed the next parts wait, so under load an entry carries what arrived during a commit,
//! and alone a publish goes at once, in an entry of its own.
//!
//! Entries are handed to the group one after another in queue order
//! ([`ClusterNode::write_in_order`]), so parts keep the order they were queued in. A failed
//! entry fails each of its parts with the same error: none of them was acknowledged.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ferrymq_cluster::partition::RecordBatch as ClusterBatch;
use ferrymq_cluster::tcp::TcpTransport;
use ferrymq_cluster::{ClusterError, ClusterNode, GroupId, Request, Response};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Entries of one group being committed at once, at most.
const IN_FLIGHT_MAX: usize = 8;
/// The most records one entry carries (the protocol's largest batch).
const FOLD_RECORDS_MAX: u32 = ferrymq_protocol::limits::BATCH_COUNT_MAX;
/// The most bytes one entry carries, unless a single part is larger.
const FOLD_BYTES_MAX: usize = 1 << 20;

/// One part waiting: its records and who waits for their first offset.
struct Part {
    count: u32,
    bytes: bytes::Bytes,
    reply: oneshot::Sender<Result<u64, ClusterError>>,
}

/// The folding tasks of a node's groups, each started on its group's first publish.
#[derive(Default)]
pub(super) struct Folds {
    queues: parking_lot::Mutex<HashMap<GroupId, mpsc::UnboundedSender<Part>>>,
}

impl Folds {
    /// Appends `records` (`count` of them) to `group`, led here, in an entry with whatever else
    /// waits for it; the offset its first record got. Gives up after `timeout`.
    pub(super) async fn append(
        &self,
        node: &Arc<ClusterNode<TcpTransport>>,
        group: GroupId,
        (count, bytes): (u32, bytes::Bytes),
        timeout: Duration,
    ) -> Result<u64, ClusterError> {
        let (reply, answer) = oneshot::channel();
        let part = Part {
            count,
            bytes,
            reply,
        };
        let refused = {
            let mut queues = self.queues.lock();
            let queue = queues
                .entry(group)
                .or_insert_with(|| spawn_fold(node.clone(), group, timeout));
            queue.send(part).err()
        };
        if let Some(mpsc::error::SendError(part)) = refused {
            // The group's task ended (the node stops): start another for the next publish.
            self.queues.lock().remove(&group);
            drop(part);
            return Err(ClusterError::NoSuchGroup(group));
        }
        answer
            .await
            .unwrap_or(Err(ClusterError::NoSuchGroup(group)))
    }

    /// Forgets `group`'s task (its group stopped here); it ends once its queue is empty.
    pub(super) fn forget(&self, group: GroupId) {
        self.queues.lock().remove(&group);
    }
}

/// Starts `group`'s folding task; it ends when its queue's sender is dropped.
fn spawn_fold(
    node: Arc<ClusterNode<TcpTransport>>,
    group: GroupId,
    timeout: Duration,
) -> mpsc::UnboundedSender<Part> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Part>();
    tokio::spawn(async move {
        let room = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
        let mut held: Option<Part> = None;
        loop {
            let first = match held.take() {
                Some(part) => part,
                None => match rx.recv().await {
                    Some(part) => part,
                    None => return,
                },
            };
            let Ok(permit) = room.clone().acquire_owned().await else {
                return;
            };
            // Whatever queued while the entries before were committed goes with `first`.
            let mut parts = vec![first];
            let (mut records, mut bytes) = (parts[0].count, parts[0].bytes.len());
            while let Ok(next) = rx.try_recv() {
                if records + next.count > FOLD_RECORDS_MAX
                    || bytes + next.bytes.len() > FOLD_BYTES_MAX
                {
                    held = Some(next);
                    break;
                }
                records += next.count;
                bytes += next.bytes.len();
                parts.push(next);
            }
            let mut payload = Vec::with_capacity(bytes);
            for part in &parts {
                payload.extend_from_slice(&part.bytes);
            }
            let batch = ClusterBatch {
                record_count: records,
                payload,
            };
            let written = node.write_in_order(group, Request::Append(batch)).await;
            tokio::spawn(async move {
                let outcome = match written {
                    Ok(wait) => match tokio::time::timeout(timeout, wait).await {
                        Ok(done) => done,
                        Err(_) => Err(ClusterError::Timeout {
                            timeout_ms: timeout.as_millis() as u64,
                        }),
                    },
                    Err(e) => Err(e),
                };
                drop(permit);
                answer(parts, outcome);
            });
        }
    });
    tx
}

/// Gives each part the offset of its first record, or the entry's error.
fn answer(
    parts: Vec<Part>,
    outcome: Result<(ferrymq_cluster::types::LogId, Response), ClusterError>,
) {
    let first = match outcome {
        Ok((_, Response::Appended(Ok(offsets)))) => Ok(offsets.first),
        Ok((_, other)) => Err(ClusterError::Raft(format!("the group answered {other:?}"))),
        Err(e) => Err(e),
    };
    let mut next = first;
    for part in parts {
        let count = u64::from(part.count);
        let _ = part.reply.send(next.clone());
        next = next.map(|offset| offset + count);
    }
}
