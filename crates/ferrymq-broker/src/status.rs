//! Message status by id, and paged listings of a subscription's messages.
//!
//! A message id is `<partition>-<offset>` within its topic. Each subscription's cursor knows the
//! state of the messages in its window (pending, delayed, in flight, on their way to the
//! dead-letter topic), and remembers the last acked and dead-lettered ones with their results
//! and reasons (`BrokerConfig::status_history` per partition, in memory: after a restart, older
//! settled messages read as `settled`).

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use ferrymq_protocol::limits::LIST_LIMIT_MAX;
use ferrymq_protocol::{
    ListKind, Message, MessageEntry, MessageState, MessageStatus, SubscriptionMessageStatus,
};

use crate::broker::Broker;
use crate::clock::unix_ms;
use crate::error::BrokerError;
use crate::headers::requeued_for_another;
use crate::log::decode_stored;
use crate::partition::Partition;
use crate::subscription::Subscription;
use crate::topic::Topic;

/// A retained message as it was published: what a dashboard shows when it previews one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub partition: u32,
    pub offset: u64,
    /// Unix ms.
    pub published_ms: u64,
    pub message: Message,
}

/// One page of a listing, and the token of the next one (empty: no more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessagePage {
    pub entries: Vec<MessageEntry>,
    pub next_page: Bytes,
}

impl Broker {
    /// What became of message `partition-offset` of `topic`, for every subscription.
    pub fn message_status(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Result<MessageStatus, BrokerError> {
        let topic = self.topic(topic)?;
        let part = partition_of(&topic, partition)?;
        let subscriptions: Vec<Arc<Subscription>> =
            topic.subscriptions.read().values().cloned().collect();
        let mut state = part.state.lock();
        let end = state.log.next_offset();
        let now_ms = unix_ms();
        let unknown = |why: &str| BrokerError::UnknownMessage {
            topic: topic.name.clone(),
            id: format!("{partition}-{offset}"),
            why: why.to_string(),
        };
        if offset >= end {
            return Err(unknown("no message was published there yet"));
        }
        let stored = match state.read_stored(offset) {
            Ok(stored) => stored,
            // Damage is named, not passed off as a message no longer retained.
            Err(error) => {
                return Err(match state.disk.as_mut() {
                    Some(disk) => disk.note_damage(&topic.name, partition, offset, error),
                    None => BrokerError::Storage(error.to_string()),
                })
            }
        };
        let Some((published_ms, record)) = stored else {
            return Err(unknown("it is no longer retained"));
        };
        let mut entries: Vec<SubscriptionMessageStatus> = subscriptions
            .iter()
            .filter_map(|sub| {
                let mut entry = state.cursor(sub.id)?.entry(offset, end)?;
                entry.partition = partition;
                entry.published_ms = published_ms;
                if entry.state == MessageState::Pending && requeued_for_another(&record, &sub.name)
                {
                    // A requeued dead letter of another subscription: this one passes it by.
                    entry.state = MessageState::Settled;
                }
                not_yet_due(&mut entry, &record, now_ms);
                Some(SubscriptionMessageStatus {
                    subscription: sub.name.clone(),
                    entry,
                })
            })
            .collect();
        drop(state);
        entries.sort_by(|a, b| a.subscription.cmp(&b.subscription));
        let message = decode_stored(record);
        Ok(MessageStatus {
            partition,
            offset,
            published_ms,
            priority: message.priority,
            key: message.key,
            body_bytes: message.body.len() as u32,
            subscriptions: entries,
        })
    }

    /// Message `partition-offset` of `topic` with its key, headers and body, as it was stored.
    pub fn stored_message(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Result<StoredMessage, BrokerError> {
        let topic = self.topic(topic)?;
        let part = partition_of(&topic, partition)?;
        let state = part.state.lock();
        let unknown = |why: &str| BrokerError::UnknownMessage {
            topic: topic.name.clone(),
            id: format!("{partition}-{offset}"),
            why: why.to_string(),
        };
        if offset >= state.log.next_offset() {
            return Err(unknown("no message was published there yet"));
        }
        let Some((published_ms, record)) = state.stored_at(offset) else {
            return Err(unknown("it is no longer retained"));
        };
        drop(state);
        Ok(StoredMessage {
            partition,
            offset,
            published_ms,
            message: decode_stored(record),
        })
    }

    /// One page of `subscription`'s messages of one kind. `page` is the token a previous page
    /// returned (empty: the first page); at most `limit` entries come back.
    pub fn list_messages(
        &self,
        topic: &str,
        subscription: &str,
        kind: ListKind,
        page: &[u8],
        limit: u32,
    ) -> Result<MessagePage, BrokerError> {
        if limit == 0 || limit > LIST_LIMIT_MAX {
            return Err(BrokerError::invalid(
                "limit",
                format!("{limit} is outside 1..={LIST_LIMIT_MAX}"),
            ));
        }
        let topic = self.topic(topic)?;
        let sub = topic
            .subscriptions
            .read()
            .get(subscription)
            .cloned()
            .ok_or_else(|| BrokerError::UnknownSubscription {
                topic: topic.name.clone(),
                subscription: subscription.to_string(),
            })?;
        let limit = limit as usize;
        match kind {
            ListKind::Pending | ListKind::InFlight => {
                list_window(&topic, &sub, kind == ListKind::InFlight, page, limit)
            }
            ListKind::Acked | ListKind::DeadLettered => {
                list_history(&topic, &sub, kind == ListKind::DeadLettered, page, limit)
            }
        }
    }
}

/// A pending message never delivered whose `deliver_after` has not passed is delayed (the cursor
/// only notices when it reaches it).
fn not_yet_due(entry: &mut MessageEntry, record: &[u8], now_ms: u64) {
    if entry.state == MessageState::Delayed && entry.due_ms != 0 && entry.due_ms <= now_ms {
        // A delay restored from before a restart that has run out: next in line.
        entry.state = MessageState::Pending;
        entry.due_ms = 0;
        return;
    }
    if entry.state != MessageState::Pending || entry.attempts != 0 {
        return;
    }
    if let Some(delay) = ferrymq_protocol::record_deliver_after_ms(record) {
        let due_ms = entry.published_ms.saturating_add(delay);
        if due_ms > now_ms {
            entry.state = MessageState::Delayed;
            entry.due_ms = due_ms;
        }
    }
}

fn partition_of(topic: &Topic, partition: u32) -> Result<&Partition, BrokerError> {
    topic.partitions.get(partition as usize).ok_or_else(|| {
        BrokerError::invalid(
            "partition",
            format!(
                "topic '{}' has partitions 0..{}",
                topic.name,
                topic.partition_count()
            ),
        )
    })
}

fn bad_page() -> BrokerError {
    BrokerError::invalid(
        "page",
        "not a token this listing handed out: start again with an empty page",
    )
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Pending or in-flight messages, partition by partition in offset order. Token: the partition
/// and offset to go on from (12 bytes).
fn list_window(
    topic: &Topic,
    sub: &Subscription,
    in_flight: bool,
    page: &[u8],
    limit: usize,
) -> Result<MessagePage, BrokerError> {
    let (mut partition, mut from) = match page.len() {
        0 => (0, 0),
        12 => (u32_at(page, 0), u64_at(page, 4)),
        _ => return Err(bad_page()),
    };
    if partition >= topic.partition_count() {
        return Err(bad_page());
    }
    let mut entries = Vec::new();
    let now_ms = unix_ms();
    loop {
        let part = &topic.partitions[partition as usize];
        let state = part.state.lock();
        let end = state.log.next_offset();
        let more = match state.cursor(sub.id) {
            Some(cursor) => {
                let (found, more) = cursor.list_window(in_flight, from, limit - entries.len(), end);
                for mut entry in found {
                    let stored = state.stored_at(entry.offset);
                    if stored
                        .as_ref()
                        .is_some_and(|(_, record)| requeued_for_another(record, &sub.name))
                    {
                        continue; // passed by, never delivered here
                    }
                    entry.partition = partition;
                    if let Some((published_ms, record)) = stored {
                        entry.published_ms = published_ms;
                        not_yet_due(&mut entry, &record, now_ms);
                    }
                    entries.push(entry);
                }
                more
            }
            None => None,
        };
        drop(state);
        let next = match more {
            Some(offset) => Some((partition, offset)),
            None if partition + 1 < topic.partition_count() => Some((partition + 1, 0)),
            None => None,
        };
        match next {
            Some((p, o)) if entries.len() < limit => (partition, from) = (p, o),
            Some((p, o)) => {
                let mut token = BytesMut::with_capacity(12);
                token.put_u32_le(p);
                token.put_u64_le(o);
                return Ok(MessagePage {
                    entries,
                    next_page: token.freeze(),
                });
            }
            None => {
                return Ok(MessagePage {
                    entries,
                    next_page: Bytes::new(),
                })
            }
        }
    }
}

/// Acked or dead-lettered messages, newest first across partitions. Token: the settle time,
/// partition and offset of the last entry handed out (20 bytes).
fn list_history(
    topic: &Topic,
    sub: &Subscription,
    dead: bool,
    page: &[u8],
    limit: usize,
) -> Result<MessagePage, BrokerError> {
    let after = match page.len() {
        0 => None,
        20 => Some((u64_at(page, 0), u32_at(page, 8), u64_at(page, 12))),
        _ => return Err(bad_page()),
    };
    // Newest first: by settle time, then partition and offset, all descending.
    let order = |e: &MessageEntry| (e.settled_ms, e.partition, e.offset);
    let mut all = Vec::new();
    for part in topic.partitions.iter() {
        let state = part.state.lock();
        if let Some(cursor) = state.cursor(sub.id) {
            for mut entry in cursor.history(dead) {
                entry.partition = part.index;
                if after.is_none_or(|a| order(&entry) < a) {
                    all.push(entry);
                }
            }
        }
    }
    all.sort_by_key(|e| std::cmp::Reverse(order(e)));
    let more = all.len() > limit;
    all.truncate(limit);
    for entry in &mut all {
        let state = topic.partitions[entry.partition as usize].state.lock();
        entry.published_ms = state.stored_at(entry.offset).map_or(0, |s| s.0);
    }
    let next_page = match all.last() {
        Some(last) if more => {
            let mut token = BytesMut::with_capacity(20);
            token.put_u64_le(last.settled_ms);
            token.put_u32_le(last.partition);
            token.put_u64_le(last.offset);
            token.freeze()
        }
        _ => Bytes::new(),
    };
    debug_assert!(all
        .iter()
        .all(|e| matches!(e.state, MessageState::Acked | MessageState::DeadLettered)));
    Ok(MessagePage {
        entries: all,
        next_page,
    })
}
