//! Statistics of a topic and its subscriptions, as STATS_REPLY carries them, with their
//! encodings.

use bytes::{BufMut, BytesMut};

use crate::error::ProtocolError;
use crate::latency::{Latency, LATENCY_BUCKETS};
use crate::limits::PROTOCOL_VERSION_3;
use crate::wire::{put_str16, Reader};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscriptionStats {
    pub name: String,
    pub ephemeral: bool,
    pub consumers: u32,
    pub messages_out: u64,
    pub bytes_out: u64,
    pub acked: u64,
    pub redelivered: u64,
    /// Messages not yet delivered (including those waiting for redelivery).
    pub backlog: u64,
    pub in_flight: u64,
    /// Messages given up after `max_attempts` deliveries (or dropped by a nack at the limit).
    pub gave_up: u64,
    /// From publish (or the end of a message's delay) to its first delivery.
    pub deliver_latency: Latency,
    /// From publish (or the end of a message's delay) to its ack, redeliveries included.
    pub ack_latency: Latency,
    /// Whether an operator paused its deliveries. Carried from protocol version 3 on; read as
    /// `false` from an older connection.
    pub paused: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicStats {
    pub name: String,
    pub messages_in: u64,
    pub bytes_in: u64,
    pub messages_out: u64,
    pub bytes_out: u64,
    /// Messages retained (queue size).
    pub depth: u64,
    pub depth_bytes: u64,
    /// Messages discarded before every subscription had them: every message the drop-oldest
    /// policy discarded (whether or not the topic had subscriptions), and those a disk topic's
    /// retention removed before a subscription received them. Each message counts once.
    pub dropped: u64,
    pub publishers: u32,
    pub subscribers: u32,
    pub subscriptions: Vec<SubscriptionStats>,
}

/// Writes one topic's statistics in the layout of protocol `version`: from version 3 on each
/// subscription ends with its `paused` byte.
pub(super) fn encode_topic_stats(t: &TopicStats, version: u16, buf: &mut BytesMut) {
    put_str16(buf, &t.name);
    for v in [
        t.messages_in,
        t.bytes_in,
        t.messages_out,
        t.bytes_out,
        t.depth,
        t.depth_bytes,
        t.dropped,
    ] {
        buf.put_u64_le(v);
    }
    buf.put_u32_le(t.publishers);
    buf.put_u32_le(t.subscribers);
    buf.put_u32_le(t.subscriptions.len() as u32);
    for s in &t.subscriptions {
        put_str16(buf, &s.name);
        buf.put_u8(s.ephemeral as u8);
        buf.put_u32_le(s.consumers);
        for v in [
            s.messages_out,
            s.bytes_out,
            s.acked,
            s.redelivered,
            s.backlog,
            s.in_flight,
            s.gave_up,
        ] {
            buf.put_u64_le(v);
        }
        encode_latency(&s.deliver_latency, buf);
        encode_latency(&s.ack_latency, buf);
        if version >= PROTOCOL_VERSION_3 {
            buf.put_u8(s.paused as u8);
        }
    }
}

pub(super) fn encode_latency(h: &Latency, buf: &mut BytesMut) {
    buf.put_u64_le(h.sum_us);
    buf.put_u16_le(h.buckets.len() as u16);
    for &(bucket, count) in &h.buckets {
        buf.put_u16_le(bucket);
        buf.put_u64_le(count);
    }
}

/// A histogram in its one canonical form: buckets ascending, each known and non-empty.
pub(super) fn decode_latency(
    r: &mut Reader,
    field: &'static str,
) -> Result<Latency, ProtocolError> {
    let sum_us = r.u64(field)?;
    let n = r.u16(field)? as usize;
    if n > LATENCY_BUCKETS {
        return Err(ProtocolError::invalid(
            field,
            format!("{n} buckets, above the {LATENCY_BUCKETS} there are"),
        ));
    }
    let mut buckets = Vec::with_capacity(n);
    for _ in 0..n {
        let bucket = r.u16(field)?;
        let count = r.u64(field)?;
        if bucket as usize >= LATENCY_BUCKETS {
            return Err(ProtocolError::invalid(
                field,
                format!(
                    "bucket {bucket} is beyond the last, {}",
                    LATENCY_BUCKETS - 1
                ),
            ));
        }
        if buckets.last().is_some_and(|&(b, _)| b >= bucket) {
            return Err(ProtocolError::invalid(
                field,
                format!("bucket {bucket} is out of ascending order"),
            ));
        }
        if count == 0 {
            return Err(ProtocolError::invalid(
                field,
                format!("bucket {bucket} has a count of 0 (empty buckets are left out)"),
            ));
        }
        buckets.push((bucket, count));
    }
    Ok(Latency { sum_us, buckets })
}

/// A boolean byte: 0 or 1, anything else refused.
fn boolean(r: &mut Reader, field: &'static str) -> Result<bool, ProtocolError> {
    match r.u8(field)? {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(ProtocolError::invalid(
            field,
            format!("{b} is not a boolean (0 or 1)"),
        )),
    }
}

/// Reads one topic's statistics written in the layout of protocol `version`.
pub(super) fn decode_topic_stats(
    r: &mut Reader,
    version: u16,
) -> Result<TopicStats, ProtocolError> {
    let mut t = TopicStats {
        name: r.str16("stats.topic.name")?,
        ..Default::default()
    };
    t.messages_in = r.u64("stats.topic.messages_in")?;
    t.bytes_in = r.u64("stats.topic.bytes_in")?;
    t.messages_out = r.u64("stats.topic.messages_out")?;
    t.bytes_out = r.u64("stats.topic.bytes_out")?;
    t.depth = r.u64("stats.topic.depth")?;
    t.depth_bytes = r.u64("stats.topic.depth_bytes")?;
    t.dropped = r.u64("stats.topic.dropped")?;
    t.publishers = r.u32("stats.topic.publishers")?;
    t.subscribers = r.u32("stats.topic.subscribers")?;
    let count = r.u32("stats.topic.subscription_count")?;
    for _ in 0..count {
        let mut s = SubscriptionStats {
            name: r.str16("stats.subscription.name")?,
            ..Default::default()
        };
        s.ephemeral = boolean(r, "stats.subscription.ephemeral")?;
        s.consumers = r.u32("stats.subscription.consumers")?;
        s.messages_out = r.u64("stats.subscription.messages_out")?;
        s.bytes_out = r.u64("stats.subscription.bytes_out")?;
        s.acked = r.u64("stats.subscription.acked")?;
        s.redelivered = r.u64("stats.subscription.redelivered")?;
        s.backlog = r.u64("stats.subscription.backlog")?;
        s.in_flight = r.u64("stats.subscription.in_flight")?;
        s.gave_up = r.u64("stats.subscription.gave_up")?;
        s.deliver_latency = decode_latency(r, "stats.subscription.deliver_latency")?;
        s.ack_latency = decode_latency(r, "stats.subscription.ack_latency")?;
        if version >= PROTOCOL_VERSION_3 {
            s.paused = boolean(r, "stats.subscription.paused")?;
        }
        t.subscriptions.push(s);
    }
    Ok(t)
}
