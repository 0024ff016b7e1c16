//! Messages, batches of records, offset ranges and deliveries. The record layout itself is
//! [`crate::record`]'s.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::ProtocolError;
use crate::limits::{
    BATCH_COUNT_MAX, DELAY_MS_MAX, HEADERS_COUNT_MAX, HEADER_BYTES_MAX, KEY_BYTES_MAX, PRIORITY_MAX,
};
use crate::record::{
    put_record_header, record_header_len, RecordHead, RecordSpan, FLAG_DELAY, FLAG_KEY,
    RECORD_PREFIX_BYTES,
};
use crate::wire::Reader;

/// The record header that carries a message's deduplication id: within the topic's window a
/// message whose id the topic already stored is not stored again (see the protocol document).
pub const HEADER_DEDUP_ID: &str = "x-ferrymq-dedup-id";

/// Fixed part of a delivery: partition, offset, timestamp, attempt.
pub const DELIVERY_PREFIX_BYTES: usize = 22;

/// A message as an application builds it or receives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    pub key: Option<Bytes>,
    pub headers: Vec<(String, String)>,
    pub priority: u8,
    pub deliver_after_ms: Option<u64>,
    pub body: Bytes,
}

impl Message {
    pub fn new(body: impl Into<Bytes>) -> Self {
        Message {
            body: body.into(),
            ..Default::default()
        }
    }

    /// Decodes one record a broker stored: it was validated when its batch was published, so it
    /// is decoded once, without validating it again. Panics if it is not a valid record.
    pub fn from_stored(record: Bytes) -> Message {
        decode_record_unchecked(&record)
    }

    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Gives the message a deduplication id ([`HEADER_DEDUP_ID`]): a retry with the same id
    /// within the topic's window is answered with the first one's id and stored once.
    pub fn with_dedup_id(self, id: impl Into<String>) -> Self {
        self.with_header(HEADER_DEDUP_ID, id)
    }

    pub fn with_priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// Checks the limits the codec enforces on decode, so that an application learns of a bad
    /// message when it builds the batch rather than from the server.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        if self.priority > PRIORITY_MAX {
            return Err(ProtocolError::invalid(
                "priority",
                format!("{} is above {PRIORITY_MAX}", self.priority),
            ));
        }
        if let Some(key) = &self.key {
            if key.len() > KEY_BYTES_MAX {
                return Err(ProtocolError::invalid(
                    "key",
                    format!("{} bytes, limit {KEY_BYTES_MAX}", key.len()),
                ));
            }
        }
        if self.headers.len() > HEADERS_COUNT_MAX {
            return Err(ProtocolError::invalid(
                "headers",
                format!("{} headers, limit {HEADERS_COUNT_MAX}", self.headers.len()),
            ));
        }
        for (name, value) in &self.headers {
            if name.is_empty() || name.len() > HEADER_BYTES_MAX || value.len() > HEADER_BYTES_MAX {
                return Err(ProtocolError::invalid("header", format!("name must be 1..={HEADER_BYTES_MAX} bytes and value at most {HEADER_BYTES_MAX}")));
            }
        }
        if let Some(delay) = self.deliver_after_ms {
            if delay > DELAY_MS_MAX {
                return Err(ProtocolError::invalid(
                    "deliver_after_ms",
                    format!("{delay} is above {DELAY_MS_MAX}"),
                ));
            }
        }
        if self.body.len() > u32::MAX as usize {
            return Err(ProtocolError::invalid("body", "longer than 4 GiB"));
        }
        Ok(())
    }

    /// Appends this message's record encoding. Callers validate first (see [`Message::validate`]).
    pub fn encode_record(&self, buf: &mut BytesMut) {
        debug_assert!(self.validate().is_ok());
        buf.reserve(self.encoded_len());
        RecordHead {
            priority: self.priority,
            key: self.key.as_deref(),
            deliver_after_ms: self.deliver_after_ms,
            header_count: self.headers.len() as u16,
            body_len: self.body.len() as u32,
        }
        .encode(buf);
        for (name, value) in &self.headers {
            put_record_header(buf, name.as_bytes(), value.as_bytes());
        }
        buf.put_slice(&self.body);
    }

    /// Length of the record encoding.
    pub fn encoded_len(&self) -> usize {
        RECORD_PREFIX_BYTES
            + if self.deliver_after_ms.is_some() {
                8
            } else {
                0
            }
            + self.key.as_ref().map_or(0, |k| k.len())
            + self
                .headers
                .iter()
                .map(|(n, v)| record_header_len(n.as_bytes(), v.as_bytes()))
                .sum::<usize>()
            + self.body.len()
    }
}

/// One validated record inside a batch, with the fields the broker routes on already parsed and
/// `raw` holding the record's exact bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub raw: Bytes,
    pub priority: u8,
    pub deliver_after_ms: Option<u64>,
    pub key: Option<Bytes>,
    pub body_len: u32,
}

impl Record {
    fn from_span(all: &Bytes, span: RecordSpan) -> Record {
        Record {
            raw: all.slice(span.start..span.end),
            priority: span.priority,
            deliver_after_ms: span.deliver_after_ms,
            key: span.key.map(|(start, end)| all.slice(start..end)),
            body_len: span.body_len,
        }
    }

    /// Decodes the full message from a record known to be valid (it came out of a batch).
    pub fn to_message(&self) -> Message {
        decode_record_unchecked(&self.raw)
    }
}

/// Decodes a record already validated by [`RecordBatch::decode`]; the caller guarantees validity,
/// so a failure here is a bug.
fn decode_record_unchecked(raw: &Bytes) -> Message {
    let mut reader = Reader::new(raw.clone());
    let message =
        decode_record(&mut reader).expect("record was validated when its batch was decoded");
    assert_eq!(reader.remaining(), 0, "validated record has trailing bytes");
    message
}

pub(crate) fn decode_record(reader: &mut Reader) -> Result<Message, ProtocolError> {
    let priority = reader.u8("record.priority")?;
    let flags = reader.u8("record.flags")?;
    let key_len = reader.u16("record.key_len")? as usize;
    let header_count = reader.u16("record.header_count")? as usize;
    let body_len = reader.u32("record.body_len")? as usize;
    let deliver_after_ms = if flags & FLAG_DELAY != 0 {
        Some(reader.u64("record.deliver_after_ms")?)
    } else {
        None
    };
    let key = if flags & FLAG_KEY != 0 {
        Some(reader.bytes(key_len, "record.key")?)
    } else {
        None
    };
    let mut headers = Vec::with_capacity(header_count);
    for _ in 0..header_count {
        let name = reader.str16("record.header.name")?;
        let value = reader.str16("record.header.value")?;
        headers.push((name, value));
    }
    let body = reader.bytes(body_len, "record.body")?;
    Ok(Message {
        key,
        headers,
        priority,
        deliver_after_ms,
        body,
    })
}

/// A validated sequence of records as carried by PUBLISH: the count and the concatenated bytes.
#[derive(Debug, Clone, Default)]
pub struct RecordBatch {
    count: u32,
    bytes: Bytes,
    /// `bytes` is an allocation of its own, exactly this long (an encoded batch, not a slice
    /// of a frame): a store may keep it as it is instead of copying what it keeps.
    exact: bool,
}

/// Batches are equal when their records are, however their bytes are held.
impl PartialEq for RecordBatch {
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count && self.bytes == other.bytes
    }
}

impl Eq for RecordBatch {}

impl RecordBatch {
    /// Encodes messages into a batch. Fails on the first message that breaks a codec limit.
    pub fn from_messages(messages: &[Message]) -> Result<RecordBatch, ProtocolError> {
        if messages.len() > BATCH_COUNT_MAX as usize {
            return Err(ProtocolError::invalid(
                "batch",
                format!("{} messages, limit {BATCH_COUNT_MAX}", messages.len()),
            ));
        }
        let mut buf = BytesMut::with_capacity(messages.iter().map(Message::encoded_len).sum());
        for message in messages {
            message.validate()?;
            message.encode_record(&mut buf);
        }
        let exact = buf.len() == buf.capacity();
        Ok(RecordBatch {
            count: messages.len() as u32,
            bytes: buf.freeze(),
            exact,
        })
    }

    /// Validates `count` records in `buf`, a buffer the caller encoded them into. When `buf` is
    /// exactly as long as its allocation, the batch may be stored without a copy.
    pub fn decode_encoded(count: u32, buf: BytesMut) -> Result<RecordBatch, ProtocolError> {
        let exact = buf.len() == buf.capacity();
        let mut batch = RecordBatch::decode(count, buf.freeze())?;
        batch.exact = exact;
        Ok(batch)
    }

    /// Validates `count` records in `bytes`, which must hold exactly those records.
    pub fn decode(count: u32, bytes: Bytes) -> Result<RecordBatch, ProtocolError> {
        if count > BATCH_COUNT_MAX {
            return Err(ProtocolError::invalid(
                "batch.count",
                format!("{count}, limit {BATCH_COUNT_MAX}"),
            ));
        }
        let mut reader = Reader::new(&bytes[..]);
        for _ in 0..count {
            RecordSpan::parse(&mut reader)?;
        }
        if reader.remaining() != 0 {
            return Err(ProtocolError::TrailingBytes {
                opcode: "record batch",
                extra: reader.remaining(),
            });
        }
        Ok(RecordBatch {
            count,
            bytes,
            exact: false,
        })
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The batch's bytes, if they are an allocation of their own and exactly this long (see
    /// [`RecordBatch::decode_encoded`]): keeping them keeps nothing else alive. Otherwise the
    /// batch back.
    pub fn into_exact_bytes(self) -> Result<Bytes, RecordBatch> {
        if self.exact {
            Ok(self.bytes)
        } else {
            Err(self)
        }
    }

    /// Where each record lies in [`RecordBatch::bytes`], without touching reference counts.
    pub fn spans(&self) -> impl Iterator<Item = RecordSpan> + '_ {
        let mut reader = Reader::new(&self.bytes[..]);
        (0..self.count).map(move |_| {
            RecordSpan::parse(&mut reader).expect("batch was validated on construction")
        })
    }

    /// The records, each with its raw bytes sliced out of the batch without copying.
    pub fn records(&self) -> impl Iterator<Item = Record> + '_ {
        self.spans()
            .map(|span| Record::from_span(&self.bytes, span))
    }

    pub fn messages(&self) -> impl Iterator<Item = Message> + '_ {
        self.records().map(|r| r.to_message())
    }
}

/// A contiguous run of offsets in one partition: `offset .. offset + count`. Publish receipts and
/// acks both speak in ranges, so a batch of a thousand costs sixteen bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OffsetRange {
    pub partition: u32,
    pub offset: u64,
    pub count: u32,
}

pub use crate::limits::OFFSET_RANGE_BYTES;

impl OffsetRange {
    pub fn single(partition: u32, offset: u64) -> Self {
        OffsetRange {
            partition,
            offset,
            count: 1,
        }
    }

    pub fn end(&self) -> u64 {
        self.offset + self.count as u64
    }

    pub(crate) fn encode(&self, buf: &mut BytesMut) {
        buf.put_u32_le(self.partition);
        buf.put_u64_le(self.offset);
        buf.put_u32_le(self.count);
    }

    pub(crate) fn decode(reader: &mut Reader) -> Result<Self, ProtocolError> {
        let partition = reader.u32("range.partition")?;
        let offset = reader.u64("range.offset")?;
        let count = reader.u32("range.count")?;
        if offset.checked_add(count as u64).is_none() {
            return Err(ProtocolError::invalid("range", "offset + count overflows"));
        }
        Ok(OffsetRange {
            partition,
            offset,
            count,
        })
    }

    /// Folds a sequence of single offsets into ranges, merging neighbours in the same partition.
    pub fn coalesce(ids: impl IntoIterator<Item = (u32, u64)>) -> Vec<OffsetRange> {
        Self::coalesce_into(ids)
    }

    /// [`OffsetRange::coalesce`] into any list of ranges (an inline one, for a publish that
    /// usually makes one range).
    pub fn coalesce_into<C>(ids: impl IntoIterator<Item = (u32, u64)>) -> C
    where
        C: Default + Extend<OffsetRange> + std::ops::DerefMut<Target = [OffsetRange]>,
    {
        let mut out = C::default();
        for (partition, offset) in ids {
            match out.last_mut() {
                Some(last)
                    if last.partition == partition
                        && last.end() == offset
                        && last.count < u32::MAX =>
                {
                    last.count += 1
                }
                _ => out.extend([OffsetRange::single(partition, offset)]),
            }
        }
        out
    }
}

/// One message as delivered to a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub partition: u32,
    pub offset: u64,
    /// Publish time, milliseconds since the Unix epoch, assigned by the broker.
    pub timestamp_ms: u64,
    /// 1 for the first delivery, counting up with each redelivery.
    pub attempt: u16,
    pub message: Message,
}

/// The deliveries of one DELIVER frame, validated, kept as bytes until iterated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeliveryBatch {
    count: u32,
    bytes: Bytes,
}

impl DeliveryBatch {
    pub fn decode(count: u32, bytes: Bytes) -> Result<DeliveryBatch, ProtocolError> {
        if count > BATCH_COUNT_MAX {
            return Err(ProtocolError::invalid(
                "deliveries.count",
                format!("{count}, limit {BATCH_COUNT_MAX}"),
            ));
        }
        let mut reader = Reader::new(&bytes[..]);
        for _ in 0..count {
            reader.skip(DELIVERY_PREFIX_BYTES, "delivery.prefix")?;
            RecordSpan::parse(&mut reader)?;
        }
        if reader.remaining() != 0 {
            return Err(ProtocolError::TrailingBytes {
                opcode: "delivery batch",
                extra: reader.remaining(),
            });
        }
        Ok(DeliveryBatch { count, bytes })
    }

    /// Builds a batch from deliveries (tests and in-process use; the server writes frames directly
    /// with [`crate::DeliverEncoder`]).
    pub fn from_deliveries(deliveries: &[Delivery]) -> Result<DeliveryBatch, ProtocolError> {
        if deliveries.len() > BATCH_COUNT_MAX as usize {
            return Err(ProtocolError::invalid(
                "deliveries",
                format!("{} deliveries, limit {BATCH_COUNT_MAX}", deliveries.len()),
            ));
        }
        let mut buf = BytesMut::new();
        for d in deliveries {
            d.message.validate()?;
            put_delivery_prefix(&mut buf, d.partition, d.offset, d.timestamp_ms, d.attempt);
            d.message.encode_record(&mut buf);
        }
        Ok(DeliveryBatch {
            count: deliveries.len() as u32,
            bytes: buf.freeze(),
        })
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    pub fn iter(&self) -> impl Iterator<Item = Delivery> + '_ {
        let mut reader = Reader::new(self.bytes.clone());
        (0..self.count).map(move |_| {
            let delivery = (|| {
                let partition = reader.u32("delivery.partition")?;
                let offset = reader.u64("delivery.offset")?;
                let timestamp_ms = reader.u64("delivery.timestamp_ms")?;
                let attempt = reader.u16("delivery.attempt")?;
                let message = decode_record(&mut reader)?;
                Ok::<_, ProtocolError>(Delivery {
                    partition,
                    offset,
                    timestamp_ms,
                    attempt,
                    message,
                })
            })();
            delivery.expect("delivery batch was validated on construction")
        })
    }
}

pub(crate) fn put_delivery_prefix(
    buf: &mut BytesMut,
    partition: u32,
    offset: u64,
    timestamp_ms: u64,
    attempt: u16,
) {
    buf.put_u32_le(partition);
    buf.put_u64_le(offset);
    buf.put_u64_le(timestamp_ms);
    buf.put_u16_le(attempt);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{record_header, record_key};

    #[test]
    fn an_encoded_batch_gives_its_bytes_to_a_store_only_when_they_are_its_own_and_exact() {
        let messages = [Message::new("one").with_key("k"), Message::new("two")];
        let encoded = RecordBatch::from_messages(&messages).unwrap();
        let wire = encoded.bytes().clone();
        // Equal whatever holds the bytes.
        let decoded = RecordBatch::decode(2, wire.clone()).unwrap();
        assert_eq!(encoded, decoded);
        assert_eq!(encoded.clone().into_exact_bytes().unwrap(), wire);
        // A batch decoded from a frame is a slice of someone else's buffer.
        assert_eq!(decoded.clone().into_exact_bytes().unwrap_err(), decoded);

        let mut exact = BytesMut::with_capacity(wire.len());
        exact.extend_from_slice(&wire);
        let batch = RecordBatch::decode_encoded(2, exact).unwrap();
        assert_eq!(batch.into_exact_bytes().unwrap(), wire);
        // Room to spare: keeping the buffer would keep the spare room too.
        let mut roomy = BytesMut::with_capacity(wire.len() + 64);
        roomy.extend_from_slice(&wire);
        assert!(RecordBatch::decode_encoded(2, roomy)
            .unwrap()
            .into_exact_bytes()
            .is_err());
        // Its records are checked all the same.
        let mut short = BytesMut::with_capacity(wire.len() - 1);
        short.extend_from_slice(&wire[..wire.len() - 1]);
        assert!(RecordBatch::decode_encoded(2, short).is_err());
    }

    #[test]
    fn coalesce_merges_neighbours_only_within_a_partition() {
        let ranges = OffsetRange::coalesce([(0, 5), (0, 6), (0, 7), (1, 8), (1, 9), (0, 10)]);
        assert_eq!(
            ranges,
            vec![
                OffsetRange {
                    partition: 0,
                    offset: 5,
                    count: 3
                },
                OffsetRange {
                    partition: 1,
                    offset: 8,
                    count: 2
                },
                OffsetRange {
                    partition: 0,
                    offset: 10,
                    count: 1
                },
            ]
        );
    }

    #[test]
    fn record_batch_rejects_a_truncated_record() {
        let batch = RecordBatch::from_messages(&[Message::new("hello").with_key("k")]).unwrap();
        let bytes = batch.bytes().slice(..batch.bytes().len() - 1);
        assert_eq!(
            RecordBatch::decode(1, bytes),
            Err(ProtocolError::Truncated {
                field: "record.body"
            })
        );
    }

    #[test]
    fn a_stored_record_decodes_to_the_published_message() {
        let message = Message {
            key: Some(Bytes::from_static(b"k1")),
            headers: vec![("a".into(), "1".into())],
            priority: 3,
            deliver_after_ms: Some(250),
            body: Bytes::from_static(b"body"),
        };
        let batch = RecordBatch::from_messages(std::slice::from_ref(&message)).unwrap();
        let record = batch.records().next().unwrap();
        assert_eq!(Message::from_stored(record.raw.clone()), message);
    }

    #[test]
    fn keys_and_headers_are_read_in_place() {
        for delay in [None, Some(5)] {
            let message = Message {
                key: Some(Bytes::from_static(b"k1")),
                headers: vec![("a".into(), "1".into()), ("b".into(), "two".into())],
                deliver_after_ms: delay,
                ..Message::new("body")
            };
            let batch = RecordBatch::from_messages(&[message]).unwrap();
            let record = batch.bytes();
            assert_eq!(record_key(record), Some(&b"k1"[..]));
            assert_eq!(record_header(record, "b"), Some(&b"two"[..]));
            assert_eq!(record_header(record, "c"), None);
        }
        let plain = RecordBatch::from_messages(&[Message::new("x")]).unwrap();
        assert_eq!(record_key(plain.bytes()), None);
        assert_eq!(record_header(plain.bytes(), "a"), None);
        assert_eq!(record_header(&[0, 0, 0, 0, 9, 0], "a"), None, "short input");
    }

    #[test]
    fn record_batch_rejects_priority_above_nine() {
        let mut raw = BytesMut::new();
        Message::new("x").encode_record(&mut raw);
        raw[0] = 10;
        assert!(matches!(
            RecordBatch::decode(1, raw.freeze()),
            Err(ProtocolError::InvalidValue {
                field: "record.priority",
                ..
            })
        ));
    }

    #[test]
    fn record_raw_bytes_are_the_exact_encoding() {
        let m = Message::new("body")
            .with_key("key")
            .with_header("a", "b")
            .with_priority(3);
        let batch = RecordBatch::from_messages(&[m.clone(), m.clone()]).unwrap();
        let records: Vec<_> = batch.records().collect();
        assert_eq!(records.len(), 2);
        let mut one = BytesMut::new();
        m.encode_record(&mut one);
        assert_eq!(records[1].raw, one.freeze());
        assert_eq!(records[1].to_message(), m);
        assert_eq!(records[1].key.as_deref(), Some(&b"key"[..]));
    }
}
