//! Reading deliveries in place: the fast way through a [`DeliveryBatch`].
//!
//! [`DeliveryBatch::iter`] builds a full [`ferrymq_protocol::Delivery`] per message (a `Message`
//! with reference-counted body and key, headers as owned strings). A consumer that only needs the
//! id and the body bytes, like the bench, reads [`DeliveryView`]s instead: borrowed slices of the
//! batch, no allocation, no reference counting.
//!
//! The walk follows the DELIVER layout of `docs/protocol.md` (a 22-byte delivery prefix, then the
//! record). The batch was validated when its frame was decoded, so the walk trusts lengths but
//! still checks every slice: an inconsistency (a bug) ends the iteration instead of panicking.

use ferrymq_protocol::{
    DeliveryBatch, OffsetRange, RecordPrefix, DELIVERY_PREFIX_BYTES, RECORD_PREFIX_BYTES,
};

use crate::offsets::push_offset;
use crate::publish::MessageId;

/// The delivery prefix (partition u32, offset u64, timestamp u64, attempt u16) and the record
/// prefix, read by [`RecordPrefix`].
const FIXED_BYTES: usize = DELIVERY_PREFIX_BYTES + RECORD_PREFIX_BYTES;

/// One delivery borrowed from its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryView<'a> {
    pub partition: u32,
    pub offset: u64,
    /// Publish time, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// 1 for the first delivery.
    pub attempt: u16,
    pub priority: u8,
    pub deliver_after_ms: Option<u64>,
    pub key: Option<&'a [u8]>,
    pub body: &'a [u8],
    header_count: u16,
    headers: &'a [u8],
}

impl<'a> DeliveryView<'a> {
    pub fn id(&self) -> MessageId {
        MessageId::new(self.partition, self.offset)
    }

    /// The headers as `(name, value)` pairs, in order.
    pub fn headers(&self) -> Headers<'a> {
        Headers {
            bytes: self.headers,
            remaining: self.header_count,
        }
    }
}

/// Iterator over a view's headers.
#[derive(Debug, Clone)]
pub struct Headers<'a> {
    bytes: &'a [u8],
    remaining: u16,
}

impl<'a> Iterator for Headers<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let mut cursor = Cursor {
            bytes: self.bytes,
            pos: 0,
        };
        let pair = (|| {
            let name_len = cursor.u16()? as usize;
            let name = std::str::from_utf8(cursor.take(name_len)?).ok()?;
            let value_len = cursor.u16()? as usize;
            let value = std::str::from_utf8(cursor.take(value_len)?).ok()?;
            Some((name, value))
        })();
        match pair {
            Some(pair) => {
                self.bytes = &self.bytes[cursor.pos..];
                Some(pair)
            }
            None => {
                debug_assert!(false, "validated headers do not parse");
                self.remaining = 0;
                None
            }
        }
    }
}

/// Iterator over the deliveries of a batch, borrowed.
#[derive(Debug, Clone)]
pub struct DeliveryViews<'a> {
    cursor: Cursor<'a>,
    remaining: u32,
}

impl<'a> Iterator for DeliveryViews<'a> {
    type Item = DeliveryView<'a>;

    fn next(&mut self) -> Option<DeliveryView<'a>> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let view = self.cursor.delivery();
        if view.is_none() {
            debug_assert!(false, "validated delivery batch does not parse");
            self.remaining = 0;
        }
        view
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.remaining as usize))
    }
}

/// Borrowed access to a batch's deliveries.
pub trait DeliveryBatchExt {
    /// The deliveries as borrowed views, in order.
    fn views(&self) -> DeliveryViews<'_>;

    /// Appends the batch's offsets to `ranges` as runs (for one ACK of the whole batch).
    fn extend_ranges(&self, ranges: &mut Vec<OffsetRange>);
}

impl DeliveryBatchExt for DeliveryBatch {
    fn views(&self) -> DeliveryViews<'_> {
        DeliveryViews {
            cursor: Cursor {
                bytes: self.bytes(),
                pos: 0,
            },
            remaining: self.count(),
        }
    }

    fn extend_ranges(&self, ranges: &mut Vec<OffsetRange>) {
        for view in self.views() {
            push_offset(ranges, view.partition, view.offset);
        }
    }
}

#[derive(Debug, Clone)]
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let slice = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(slice)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    fn delivery(&mut self) -> Option<DeliveryView<'a>> {
        // The delivery prefix and the record prefix in one bounds check.
        let fixed: [u8; FIXED_BYTES] = self.array()?;
        let u16_at = |at: usize| u16::from_le_bytes([fixed[at], fixed[at + 1]]);
        let u32_at = |at: usize| {
            u32::from_le_bytes([fixed[at], fixed[at + 1], fixed[at + 2], fixed[at + 3]])
        };
        let u64_at = |at: usize| (u32_at(at) as u64) | ((u32_at(at + 4) as u64) << 32);
        let partition = u32_at(0);
        let offset = u64_at(4);
        let timestamp_ms = u64_at(12);
        let attempt = u16_at(20);
        let record = RecordPrefix::read(fixed.last_chunk()?);
        let deliver_after_ms = if record.has_delay() {
            Some(self.u64()?)
        } else {
            None
        };
        let key = if record.has_key() {
            Some(self.take(record.key_len as usize)?)
        } else {
            None
        };
        let headers_start = self.pos;
        let (priority, header_count) = (record.priority, record.header_count);
        for _ in 0..header_count {
            let name_len = self.u16()? as usize;
            self.take(name_len)?;
            let value_len = self.u16()? as usize;
            self.take(value_len)?;
        }
        let headers = &self.bytes[headers_start..self.pos];
        let body = self.take(record.body_len as usize)?;
        Some(DeliveryView {
            partition,
            offset,
            timestamp_ms,
            attempt,
            priority,
            deliver_after_ms,
            key,
            body,
            header_count,
            headers,
        })
    }
}

#[cfg(test)]
mod tests {
    use ferrymq_protocol::{Delivery, Message};

    use super::*;

    fn sample() -> Vec<Delivery> {
        let mut delayed = Message::new("later").with_priority(9);
        delayed.deliver_after_ms = Some(1500);
        vec![
            Delivery {
                partition: 0,
                offset: 7,
                timestamp_ms: 1,
                attempt: 1,
                message: Message::new("plain"),
            },
            Delivery {
                partition: 2,
                offset: 8,
                timestamp_ms: 2,
                attempt: 3,
                message: Message::new(vec![0u8, 255])
                    .with_key("k-1")
                    .with_header("a", "1")
                    .with_header("bé", ""),
            },
            Delivery {
                partition: 2,
                offset: 9,
                timestamp_ms: 3,
                attempt: 1,
                message: delayed,
            },
            Delivery {
                partition: 2,
                offset: 10,
                timestamp_ms: 4,
                attempt: 1,
                message: Message::new(""),
            },
        ]
    }

    #[test]
    fn views_read_the_same_fields_as_full_decoding() {
        let batch = DeliveryBatch::from_deliveries(&sample()).unwrap();
        let views: Vec<DeliveryView> = batch.views().collect();
        let full: Vec<Delivery> = batch.iter().collect();
        assert_eq!(views.len(), full.len());
        for (view, delivery) in views.iter().zip(&full) {
            let message = &delivery.message;
            assert_eq!(
                (view.partition, view.offset, view.timestamp_ms, view.attempt),
                (
                    delivery.partition,
                    delivery.offset,
                    delivery.timestamp_ms,
                    delivery.attempt
                )
            );
            assert_eq!(view.priority, message.priority);
            assert_eq!(view.deliver_after_ms, message.deliver_after_ms);
            assert_eq!(view.key, message.key.as_deref());
            assert_eq!(view.body, &message.body[..]);
            let headers: Vec<(String, String)> = view
                .headers()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect();
            assert_eq!(headers, message.headers);
            assert_eq!(view.id(), MessageId::from(delivery));
        }
    }

    #[test]
    fn batch_ranges_coalesce_runs() {
        let batch = DeliveryBatch::from_deliveries(&sample()).unwrap();
        let mut ranges = Vec::new();
        batch.extend_ranges(&mut ranges);
        assert_eq!(
            ranges,
            vec![
                OffsetRange::single(0, 7),
                OffsetRange {
                    partition: 2,
                    offset: 8,
                    count: 3
                }
            ]
        );
    }

    #[test]
    fn a_truncated_batch_ends_the_walk_instead_of_panicking() {
        let batch = DeliveryBatch::from_deliveries(&sample()).unwrap();
        let bytes = &batch.bytes()[..batch.bytes().len() - 1];
        let mut views = DeliveryViews {
            cursor: Cursor { bytes, pos: 0 },
            remaining: 4,
        };
        for _ in 0..3 {
            assert!(views.next().is_some());
        }
        // The last record is cut short: in release builds the walk just ends.
        if !cfg!(debug_assertions) {
            assert!(views.next().is_none());
        }
    }

    mod layout {
        use bytes::Bytes;
        use ferrymq_protocol::limits::{
            DELAY_MS_MAX, HEADERS_COUNT_MAX, HEADER_BYTES_MAX, KEY_BYTES_MAX, PRIORITY_MAX,
        };
        use ferrymq_protocol::{Delivery, DeliveryBatch, Message};
        use proptest::collection::vec;
        use proptest::prelude::*;

        use super::super::DeliveryBatchExt;

        fn message() -> impl Strategy<Value = Message> {
            let key = prop_oneof![vec(any::<u8>(), 0..16), vec(any::<u8>(), KEY_BYTES_MAX)];
            let headers = prop_oneof![
                vec(("[a-z]{1,8}", "\\PC{0,8}"), 0..4),
                vec(("[a-z]{1,8}", "[a-z]{0,4}"), HEADERS_COUNT_MAX),
                vec(
                    (
                        proptest::string::string_regex(&format!("[a-z]{{{HEADER_BYTES_MAX}}}"))
                            .expect("a valid pattern"),
                        Just(String::new()),
                    ),
                    1..2
                ),
            ];
            (
                0..=PRIORITY_MAX,
                proptest::option::of(key),
                proptest::option::of(0..=DELAY_MS_MAX),
                headers,
                vec(any::<u8>(), 0..64),
            )
                .prop_map(|(priority, key, deliver_after_ms, headers, body)| Message {
                    key: key.map(Bytes::from),
                    headers,
                    priority,
                    deliver_after_ms,
                    body: Bytes::from(body),
                })
        }

        proptest! {
            /// The views read every field the record layout holds exactly as the protocol
            /// crate's decoder does, for messages with keys and headers up to their limits.
            #[test]
            fn views_read_what_the_protocol_wrote(
                messages in vec(message(), 1..4),
                attempt in 1..=u16::MAX,
            ) {
                let deliveries: Vec<Delivery> = messages
                    .into_iter()
                    .enumerate()
                    .map(|(i, message)| Delivery {
                        partition: i as u32,
                        offset: 1 << 40 | i as u64,
                        timestamp_ms: 1_700_000_000_000 + i as u64,
                        attempt,
                        message,
                    })
                    .collect();
                let batch = DeliveryBatch::from_deliveries(&deliveries).expect("valid deliveries");
                let views: Vec<_> = batch.views().collect();
                prop_assert_eq!(views.len(), deliveries.len());
                for (view, delivery) in views.iter().zip(batch.iter()) {
                    prop_assert_eq!(view.partition, delivery.partition);
                    prop_assert_eq!(view.offset, delivery.offset);
                    prop_assert_eq!(view.timestamp_ms, delivery.timestamp_ms);
                    prop_assert_eq!(view.attempt, delivery.attempt);
                    let message = &delivery.message;
                    prop_assert_eq!(view.priority, message.priority);
                    prop_assert_eq!(view.deliver_after_ms, message.deliver_after_ms);
                    prop_assert_eq!(view.key, message.key.as_deref());
                    prop_assert_eq!(view.body, &message.body[..]);
                    let headers: Vec<(String, String)> = view
                        .headers()
                        .map(|(n, v)| (n.to_owned(), v.to_owned()))
                        .collect();
                    prop_assert_eq!(&headers, &message.headers);
                }
            }
        }
    }
}
