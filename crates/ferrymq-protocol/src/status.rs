//! What the broker knows about single messages: MESSAGE_STATUS replies, MESSAGE_LIST entries, and
//! the selections of LIST_MESSAGES and REQUEUE_DEAD.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::ProtocolError;
use crate::limits::{ACK_RESULT_BYTES_MAX, KEY_BYTES_MAX, PRIORITY_MAX};
use crate::wire::{put_bytes16, put_str16, Reader};

macro_rules! snake_case_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $($(#[$vmeta:meta])* $variant:ident = $value:literal => $text:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)*
        }

        impl $name {
            /// The wire value; `None` for a value this version does not assign.
            pub fn from_u8(v: u8) -> Option<$name> {
                match v {
                    $($value => Some($name::$variant),)*
                    _ => None,
                }
            }

            /// The stable snake_case name, as in `docs/protocol.md` and the test vectors.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)*
                    _ => Err(format!(
                        concat!("'{}' is not ", $what, ": use ", snake_case_enum!(@list $($text),*)),
                        s
                    )),
                }
            }
        }
    };
    (@list $first:literal $(, $rest:literal)*) => { concat!($first $(, ", ", $rest)*) };
}

snake_case_enum! {
    /// Where one message stands in one subscription.
    pub enum MessageState ("a message state") {
        /// Ready for delivery, not yet delivered (or given back for redelivery).
        Pending = 0 => "pending",
        /// Not to be delivered before `due_ms` (a delayed publish or a delayed nack).
        Delayed = 1 => "delayed",
        /// Delivered and waiting for its ack until `due_ms`.
        InFlight = 2 => "in_flight",
        /// Acked.
        Acked = 3 => "acked",
        /// Given up and moved to the dead-letter topic.
        DeadLettered = 4 => "dead_lettered",
        /// Settled longer ago than the broker's bounded history remembers: acked or dead-lettered,
        /// the outcome is unknown.
        Settled = 5 => "settled",
        /// Before where the subscription started in its partition (published before a `latest`
        /// subscription existed, or below its start offset or time): never the subscription's,
        /// so neither delivered nor settled by it.
        BeforeStart = 6 => "before_start",
    }
}

impl MessageState {
    /// The state's value on the wire in protocol `version`: a state the version does not know is
    /// written as the nearest one it has. `before_start` (version 2) is `settled` in version 1:
    /// the subscription will never deliver the message, and version 1 says so with `settled`.
    pub fn wire_value(self, version: u16) -> u8 {
        match self {
            MessageState::BeforeStart if version < crate::limits::PROTOCOL_VERSION_2 => {
                MessageState::Settled as u8
            }
            state => state as u8,
        }
    }
}

snake_case_enum! {
    /// Which messages of a subscription LIST_MESSAGES lists.
    pub enum ListKind ("a listing kind") {
        /// Not yet delivered, delayed ones included: partition, then offset order.
        Pending = 0 => "pending",
        /// Delivered and not yet acked: partition, then offset order.
        InFlight = 1 => "in_flight",
        /// Acked, newest first, from the broker's bounded history.
        Acked = 2 => "acked",
        /// Dead-lettered, newest first, from the broker's bounded history.
        DeadLettered = 3 => "dead_lettered",
    }
}

/// One message as one subscription sees it: an entry of MESSAGE_STATUS_REPLY and of MESSAGE_LIST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageEntry {
    pub partition: u32,
    pub offset: u64,
    pub state: MessageState,
    /// Deliveries so far.
    pub attempts: u16,
    /// Publish time, Unix ms.
    pub published_ms: u64,
    /// First delivery, Unix ms; 0 = never delivered, or unknown.
    pub first_delivered_ms: u64,
    /// When it was acked or dead-lettered, Unix ms; 0 = not settled, or unknown.
    pub settled_ms: u64,
    /// Delayed: when it is due; in flight: its ack deadline; otherwise 0 (Unix ms).
    pub due_ms: u64,
    /// What the consumer attached to its ack (ACK_RESULT); at most
    /// [`ACK_RESULT_BYTES_MAX`] bytes, empty when none.
    pub result: Bytes,
    /// Why it was dead-lettered; empty otherwise.
    pub reason: String,
    /// Where it went in the dead-letter topic: `(partition, offset)`.
    pub dead_letter: Option<(u32, u64)>,
}

/// A message's entry in one subscription of its topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionMessageStatus {
    pub subscription: String,
    pub entry: MessageEntry,
}

/// The reply to MESSAGE_STATUS: the message itself and its state in every subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageStatus {
    pub partition: u32,
    pub offset: u64,
    /// Publish time, Unix ms.
    pub published_ms: u64,
    pub priority: u8,
    pub key: Option<Bytes>,
    /// Size of the body (the body itself is not sent).
    pub body_bytes: u32,
    pub subscriptions: Vec<SubscriptionMessageStatus>,
}

/// Which dead letters REQUEUE_DEAD publishes again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequeueSelection {
    /// Every dead letter of the dead-letter topic.
    All,
    /// The dead letters at offsets `first..=last` of one partition of the dead-letter topic
    /// (`first == last` for one message).
    Range {
        partition: u32,
        first: u64,
        last: u64,
    },
}

const REQUEUE_ALL: u8 = 0;
const REQUEUE_RANGE: u8 = 1;

fn read_bool(r: &mut Reader, field: &'static str) -> Result<bool, ProtocolError> {
    match r.u8(field)? {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(ProtocolError::invalid(
            field,
            format!("{b} is not a boolean (0 or 1)"),
        )),
    }
}

/// Reads an ack result: bytes16 of at most [`ACK_RESULT_BYTES_MAX`] bytes.
pub(crate) fn read_result(r: &mut Reader, field: &'static str) -> Result<Bytes, ProtocolError> {
    let result = r.bytes16(field)?;
    if result.len() > ACK_RESULT_BYTES_MAX {
        return Err(ProtocolError::invalid(
            field,
            format!(
                "{} bytes, above the limit of {ACK_RESULT_BYTES_MAX}",
                result.len()
            ),
        ));
    }
    Ok(result)
}

pub(crate) fn encode_entry(e: &MessageEntry, version: u16, buf: &mut BytesMut) {
    buf.put_u32_le(e.partition);
    buf.put_u64_le(e.offset);
    buf.put_u8(e.state.wire_value(version));
    buf.put_u16_le(e.attempts);
    buf.put_u64_le(e.published_ms);
    buf.put_u64_le(e.first_delivered_ms);
    buf.put_u64_le(e.settled_ms);
    buf.put_u64_le(e.due_ms);
    put_bytes16(buf, &e.result);
    put_str16(buf, &e.reason);
    let (present, partition, offset) = match e.dead_letter {
        Some((p, o)) => (1, p, o),
        None => (0, 0, 0),
    };
    buf.put_u8(present);
    buf.put_u32_le(partition);
    buf.put_u64_le(offset);
}

pub(crate) fn decode_entry(r: &mut Reader, version: u16) -> Result<MessageEntry, ProtocolError> {
    let partition = r.u32("message_entry.partition")?;
    let offset = r.u64("message_entry.offset")?;
    let state = r.u8("message_entry.state")?;
    let state = MessageState::from_u8(state)
        .filter(|s| s.wire_value(version) == *s as u8)
        .ok_or_else(|| {
            ProtocolError::invalid(
                "message_entry.state",
                format!("unknown state {state} in protocol version {version}"),
            )
        })?;
    let attempts = r.u16("message_entry.attempts")?;
    let published_ms = r.u64("message_entry.published_ms")?;
    let first_delivered_ms = r.u64("message_entry.first_delivered_ms")?;
    let settled_ms = r.u64("message_entry.settled_ms")?;
    let due_ms = r.u64("message_entry.due_ms")?;
    let result = read_result(r, "message_entry.result")?;
    let reason = r.str16("message_entry.reason")?;
    let present = read_bool(r, "message_entry.dead_letter")?;
    let dl_partition = r.u32("message_entry.dead_letter_partition")?;
    let dl_offset = r.u64("message_entry.dead_letter_offset")?;
    let dead_letter = if present {
        Some((dl_partition, dl_offset))
    } else if dl_partition != 0 || dl_offset != 0 {
        // Zeros when absent keeps the decoding canonical: what decodes re-encodes to its bytes.
        return Err(ProtocolError::invalid(
            "message_entry.dead_letter",
            format!("{dl_partition}-{dl_offset} given without the present flag: must be 0-0"),
        ));
    } else {
        None
    };
    Ok(MessageEntry {
        partition,
        offset,
        state,
        attempts,
        published_ms,
        first_delivered_ms,
        settled_ms,
        due_ms,
        result,
        reason,
        dead_letter,
    })
}

pub(crate) fn encode_message_status(s: &MessageStatus, version: u16, buf: &mut BytesMut) {
    buf.put_u32_le(s.partition);
    buf.put_u64_le(s.offset);
    buf.put_u64_le(s.published_ms);
    buf.put_u8(s.priority);
    buf.put_u8(s.key.is_some() as u8);
    put_bytes16(buf, s.key.as_deref().unwrap_or_default());
    buf.put_u32_le(s.body_bytes);
    buf.put_u32_le(s.subscriptions.len() as u32);
    for sub in &s.subscriptions {
        put_str16(buf, &sub.subscription);
        encode_entry(&sub.entry, version, buf);
    }
}

pub(crate) fn decode_message_status(
    r: &mut Reader,
    version: u16,
) -> Result<MessageStatus, ProtocolError> {
    let partition = r.u32("message_status.partition")?;
    let offset = r.u64("message_status.offset")?;
    let published_ms = r.u64("message_status.published_ms")?;
    let priority = r.u8("message_status.priority")?;
    if priority > PRIORITY_MAX {
        return Err(ProtocolError::invalid(
            "message_status.priority",
            format!("{priority} is above {PRIORITY_MAX}"),
        ));
    }
    let has_key = read_bool(r, "message_status.has_key")?;
    let key = r.bytes16("message_status.key")?;
    if key.len() > KEY_BYTES_MAX {
        return Err(ProtocolError::invalid(
            "message_status.key",
            format!("{} bytes, above the limit of {KEY_BYTES_MAX}", key.len()),
        ));
    }
    if !has_key && !key.is_empty() {
        return Err(ProtocolError::invalid(
            "message_status.key",
            format!("{} bytes given with has_key 0: must be empty", key.len()),
        ));
    }
    let body_bytes = r.u32("message_status.body_bytes")?;
    let count = r.u32("message_status.subscription_count")?;
    let mut subscriptions = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        subscriptions.push(SubscriptionMessageStatus {
            subscription: r.str16("message_status.subscription")?,
            entry: decode_entry(r, version)?,
        });
    }
    Ok(MessageStatus {
        partition,
        offset,
        published_ms,
        priority,
        key: has_key.then_some(key),
        body_bytes,
        subscriptions,
    })
}

pub(crate) fn encode_requeue_selection(s: &RequeueSelection, buf: &mut BytesMut) {
    let (kind, partition, first, last) = match *s {
        RequeueSelection::All => (REQUEUE_ALL, 0, 0, 0),
        RequeueSelection::Range {
            partition,
            first,
            last,
        } => (REQUEUE_RANGE, partition, first, last),
    };
    buf.put_u8(kind);
    buf.put_u32_le(partition);
    buf.put_u64_le(first);
    buf.put_u64_le(last);
}

pub(crate) fn decode_requeue_selection(r: &mut Reader) -> Result<RequeueSelection, ProtocolError> {
    let kind = r.u8("requeue_dead.selection")?;
    let partition = r.u32("requeue_dead.partition")?;
    let first = r.u64("requeue_dead.first_offset")?;
    let last = r.u64("requeue_dead.last_offset")?;
    match kind {
        REQUEUE_ALL => {
            // "All" carries no position; refusing one keeps the decoding canonical.
            for (field, value) in [
                ("requeue_dead.partition", partition as u64),
                ("requeue_dead.first_offset", first),
                ("requeue_dead.last_offset", last),
            ] {
                if value != 0 {
                    return Err(ProtocolError::invalid(
                        field,
                        format!("{value} must be 0 when every dead letter is selected"),
                    ));
                }
            }
            Ok(RequeueSelection::All)
        }
        REQUEUE_RANGE if last < first => Err(ProtocolError::invalid(
            "requeue_dead.last_offset",
            format!("range {first}..={last} ends before it starts"),
        )),
        REQUEUE_RANGE => Ok(RequeueSelection::Range {
            partition,
            first,
            last,
        }),
        k => Err(ProtocolError::invalid(
            "requeue_dead.selection",
            format!("unknown selection {k}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_roundtrip() {
        for v in 0..=u8::MAX {
            if let Some(s) = MessageState::from_u8(v) {
                assert_eq!(s as u8, v);
                assert_eq!(s.to_string().parse::<MessageState>(), Ok(s));
            }
            if let Some(k) = ListKind::from_u8(v) {
                assert_eq!(k as u8, v);
                assert_eq!(k.to_string().parse::<ListKind>(), Ok(k));
            }
        }
        assert_eq!(MessageState::from_u8(6), Some(MessageState::BeforeStart));
        assert_eq!(MessageState::from_u8(7), None);
        assert_eq!(ListKind::from_u8(4), None);
        assert_eq!(MessageState::InFlight.to_string(), "in_flight");
        assert_eq!(
            "dead_lettered".parse::<ListKind>(),
            Ok(ListKind::DeadLettered)
        );
        let error = "inflight".parse::<ListKind>().unwrap_err();
        assert!(
            error.contains("pending, in_flight, acked, dead_lettered"),
            "{error}"
        );
        assert!("settled".parse::<ListKind>().is_err());
        assert_eq!("settled".parse::<MessageState>(), Ok(MessageState::Settled));
    }
}
