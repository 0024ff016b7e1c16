//! Requeueing dead letters: a message of a dead-letter topic is published again to the topic and
//! partition it died in, for the subscription that gave it up only (the header
//! [`HEADER_REQUEUE_FOR`] names it; the other subscriptions of the source pass it by).
//!
//! Each dead letter is requeued at most once: the offsets requeued are kept per (dead-letter
//! topic, partition) as runs, in memory for a memory topic and in the metadata store for a disk
//! topic. An offset is recorded only after its publish succeeded, and the record is saved before
//! the call returns; a crash in between requeues those messages again on the next call (at least
//! once, like everything else).
//!
//! The runs live in a process-wide registry keyed by the dead-letter topic's identity (not its
//! name): a topic deleted and created again starts with nothing requeued, and so does every
//! broker. A disk topic's runs are loaded from the store on first use.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use ferrymq_protocol::{Message, RecordBatch};

use crate::broker::Broker;
use crate::error::BrokerError;
use crate::headers::{HEADER_PARTITION, HEADER_REQUEUE_FOR, HEADER_SUBSCRIPTION, HEADER_TOPIC};
use crate::requeue_ledger::{runs_contain, runs_insert, runs_prune, Ledger};
use crate::topic::Topic;

/// Header of a requeued message: where it was in the dead-letter topic, `<topic>/<partition>-<offset>`.
pub const HEADER_REQUEUED_FROM: &str = "x-ferrymq-requeued-from";

/// Every header a dead letter gets starts with this.
const DEAD_HEADER_PREFIX: &str = "x-ferrymq-dead-";

/// Records read from a dead-letter partition at a time, and their bytes (the first record is
/// always read, whatever its size).
const CHUNK_RECORDS: usize = 1000;
const CHUNK_BYTES: usize = 4 << 20;

/// What a requeue did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequeueOutcome {
    /// Dead letters published again to their source.
    pub requeued: u64,
    /// Records selected but left: requeued before, not dead letters (no
    /// `x-ferrymq-dead-topic` header, or no valid partition or subscription), or from a source
    /// topic (or partition) that no longer exists.
    pub skipped: u64,
}

/// The (partition, first, last) offset ranges a requeue selects: the one asked for, checked,
/// or every partition whole.
fn selected_ranges(
    dlq: &Topic,
    range: Option<(u32, u64, u64)>,
) -> Result<Vec<(u32, u64, u64)>, BrokerError> {
    Ok(match range {
        Some((partition, first, last)) => {
            if partition >= dlq.partition_count() {
                return Err(BrokerError::invalid(
                    "partition",
                    format!(
                        "{partition} is not within the topic's partitions 0-{}",
                        dlq.partition_count() - 1
                    ),
                ));
            }
            if last < first {
                return Err(BrokerError::invalid(
                    "last_offset",
                    format!("{last} is below first_offset {first}"),
                ));
            }
            vec![(partition, first, last)]
        }
        None => (0..dlq.partition_count())
            .map(|p| (p, 0, u64::MAX))
            .collect(),
    })
}

/// A dead letter ready to go back.
struct Requeue {
    offset: u64,
    topic: Arc<Topic>,
    partition: u32,
    message: Message,
}

impl Broker {
    /// Publishes dead letters of `dead_letter_topic` again to their source topics, for the
    /// subscription they died in only. `range`: `None` = every dead letter retained;
    /// `Some((partition, first, last))` = the inclusive offset range of that partition (one
    /// message: `first == last`).
    ///
    /// Each goes to the partition it came from, as the original message (key, priority, body
    /// and headers, without the `x-ferrymq-dead-*` ones and without delay) with the headers
    /// [`HEADER_REQUEUE_FOR`] (the subscription) and [`HEADER_REQUEUED_FROM`]. A dead letter
    /// requeued before is skipped, so calling this twice publishes nothing twice. A publish that
    /// fails stops the requeue with its error; what went before stays requeued.
    pub async fn requeue_dead_letters(
        &self,
        dead_letter_topic: &str,
        range: Option<(u32, u64, u64)>,
    ) -> Result<RequeueOutcome, BrokerError> {
        let dlq = match self.topic(dead_letter_topic) {
            Ok(dlq) => dlq,
            // Created when the first message dies: until then it has no dead letters, which is
            // no error. A name no subscription sends to is still unknown (a typo, most likely).
            Err(BrokerError::UnknownTopic(_)) if self.is_dead_letter_topic(dead_letter_topic) => {
                return Ok(RequeueOutcome {
                    requeued: 0,
                    skipped: range.map_or(0, |(_, first, last)| {
                        last.saturating_sub(first).saturating_add(1)
                    }),
                })
            }
            Err(error) => return Err(error),
        };
        let selected = selected_ranges(&dlq, range)?;
        let mut guard = dlq.requeued.lock().await;
        self.load_ledger(&dlq, &mut guard)?;
        let ledger = &mut *guard;
        let mut outcome = RequeueOutcome::default();
        for (partition, first, last) in selected {
            // What is there now: dead letters that arrive meanwhile (requeued ones dying again)
            // wait for the next call.
            let end = dlq.partitions[partition as usize]
                .state
                .lock()
                .log
                .next_offset()
                .min(last.saturating_add(1));
            let mut from = first;
            while from < end {
                let mut records = Vec::new();
                from = dlq.partitions[partition as usize]
                    .state
                    .lock()
                    .read_records(from, end, (CHUNK_RECORDS, CHUNK_BYTES), &mut records)?;
                if records.is_empty() {
                    break;
                }
                let runs = ledger.runs.entry(partition).or_default();
                let copies = ledger.copies.entry(partition).or_default();
                let mut added = Vec::new();
                let result = self
                    .requeue_records(&dlq, partition, records, runs, &mut added, &mut outcome)
                    .await;
                if !added.is_empty() {
                    copies.extend(added.iter().copied());
                    self.save_requeued(&dlq, partition, runs, copies, &added)?;
                }
                result?;
            }
        }
        if outcome.requeued > 0 {
            tracing::info!(dead_letter_topic = %dlq.name, requeued = outcome.requeued, skipped = outcome.skipped,
                "dead letters requeued to their source");
        }
        Ok(outcome)
    }

    /// Reads a disk dead-letter topic's ledger from the metadata store, once.
    fn load_ledger(&self, dlq: &Topic, ledger: &mut Ledger) -> Result<(), BrokerError> {
        if ledger.loaded {
            return Ok(());
        }
        if let (Some(store), true) = (self.meta_store(), dlq.is_disk()) {
            ledger.runs = store.load_requeued(&dlq.name)?.into_iter().collect();
            for (partition, offset, copy_partition, copy_offset) in
                store.load_requeue_copies(&dlq.name)?
            {
                ledger
                    .copies
                    .entry(partition)
                    .or_default()
                    .insert(offset, (copy_partition, copy_offset));
            }
        }
        ledger.loaded = true;
        Ok(())
    }

    /// Where each of the given dead letters of `dead_letter_topic` was requeued to: its copy's
    /// `(partition, offset)` in the source topic, or `None` (not requeued, requeued before copies
    /// were recorded, or no such topic).
    pub async fn requeued_copies(
        &self,
        dead_letter_topic: &str,
        letters: &[(u32, u64)],
    ) -> Vec<Option<(u32, u64)>> {
        let Ok(dlq) = self.topic(dead_letter_topic) else {
            return vec![None; letters.len()];
        };
        let mut ledger = dlq.requeued.lock().await;
        if self.load_ledger(&dlq, &mut ledger).is_err() {
            return vec![None; letters.len()];
        }
        letters
            .iter()
            .map(|(partition, offset)| ledger.copies.get(partition)?.get(offset).copied())
            .collect()
    }

    /// Requeues the records not requeued before, recording each publish that succeeded in
    /// `runs`, and in `added` where each went.
    async fn requeue_records(
        &self,
        dlq: &Topic,
        partition: u32,
        records: Vec<(u64, Bytes)>,
        runs: &mut Vec<(u64, u64)>,
        added: &mut Vec<(u64, (u32, u64))>,
        outcome: &mut RequeueOutcome,
    ) -> Result<(), BrokerError> {
        let mut ready = Vec::with_capacity(records.len());
        for (offset, record) in records {
            if runs_contain(runs, offset) {
                outcome.skipped += 1;
                continue;
            }
            match self.prepare_requeue(dlq, partition, offset, record) {
                Some(requeue) => ready.push(requeue),
                None => outcome.skipped += 1,
            }
        }
        // One publish per run of messages for the same source partition.
        let mut rest = ready.as_slice();
        while let Some(head) = rest.first() {
            let n = rest
                .iter()
                .take_while(|r| Arc::ptr_eq(&r.topic, &head.topic) && r.partition == head.partition)
                .count();
            let (group, tail) = rest.split_at(n);
            rest = tail;
            let messages: Vec<Message> = group.iter().map(|r| r.message.clone()).collect();
            let batch = RecordBatch::from_messages(&messages)
                .map_err(|e| BrokerError::invalid("message", e.to_string()))?;
            let receipt = self
                .publish_to(&head.topic, Some(head.partition), batch)
                .await?;
            for (r, copy) in group.iter().zip(receipt.ids()) {
                runs_insert(runs, r.offset);
                added.push((r.offset, copy));
            }
            outcome.requeued += n as u64;
        }
        Ok(())
    }

    /// The message to publish again for the record at `offset`, and where; `None` when it is
    /// not a dead letter or its source is gone.
    fn prepare_requeue(
        &self,
        dlq: &Topic,
        partition: u32,
        offset: u64,
        record: Bytes,
    ) -> Option<Requeue> {
        let mut message = crate::log::decode_stored(record);
        let header = |name: &str| {
            message
                .headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let source = header(HEADER_TOPIC)?;
        let subscription = header(HEADER_SUBSCRIPTION)?;
        let source_partition: u32 = header(HEADER_PARTITION)?.parse().ok()?;
        let topic = match self.topic(&source) {
            Ok(topic)
                if source_partition < topic.partition_count()
                    && topic.subscriptions.read().contains_key(&subscription) =>
            {
                topic
            }
            _ => {
                tracing::debug!(dead_letter_topic = %dlq.name, partition, offset, source = %source,
                    source_partition, subscription = %subscription,
                    "dead letter not requeued: its source topic, partition or subscription no longer exists");
                return None;
            }
        };
        // A requeue is a deliberate second publish: the original's deduplication id would
        // have it taken for a retry of the first within the window.
        message.headers.retain(|(k, _)| {
            !(k.starts_with(DEAD_HEADER_PREFIX)
                || k == HEADER_REQUEUE_FOR
                || k == HEADER_REQUEUED_FROM
                || k == crate::dedup::HEADER_DEDUP_ID)
        });
        message
            .headers
            .truncate(ferrymq_protocol::limits::HEADERS_COUNT_MAX - 2);
        message
            .headers
            .push((HEADER_REQUEUE_FOR.to_string(), subscription));
        message.headers.push((
            HEADER_REQUEUED_FROM.to_string(),
            format!("{}/{partition}-{offset}", dlq.name),
        ));
        message.deliver_after_ms = None;
        Some(Requeue {
            offset,
            topic,
            partition: source_partition,
            message,
        })
    }

    /// Drops the runs the partition no longer retains and, for a disk topic, saves the rest.
    fn save_requeued(
        &self,
        dlq: &Topic,
        partition: u32,
        runs: &mut Vec<(u64, u64)>,
        copies: &mut BTreeMap<u64, (u32, u64)>,
        added: &[(u64, (u32, u64))],
    ) -> Result<(), BrokerError> {
        let start = dlq.partitions[partition as usize]
            .state
            .lock()
            .first_offset();
        runs_prune(runs, start);
        *copies = copies.split_off(&start);
        match (self.meta_store(), dlq.is_disk()) {
            (Some(store), true) => {
                store.put_requeued(&dlq.name, &[(partition, runs)])?;
                store.put_requeue_copies(&dlq.name, partition, added, start)
            }
            _ => Ok(()),
        }
    }
}
