//! Message ids, publish receipts, and the future of a publish in flight.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};

use bytes::Bytes;
use ferrymq_protocol::limits::{BATCH_COUNT_MAX, FRAME_HEADER_BYTES};
use ferrymq_protocol::{opcode, Delivery, Durability, Frame, FrameHeader, OffsetRange};

use crate::conn::PendingResponse;
use crate::error::{Error, Result};

/// Where a message lives: its partition and its offset there. Displayed `<partition>-<offset>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId {
    pub partition: u32,
    pub offset: u64,
}

impl MessageId {
    pub fn new(partition: u32, offset: u64) -> Self {
        MessageId { partition, offset }
    }
}

impl From<&Delivery> for MessageId {
    fn from(delivery: &Delivery) -> Self {
        MessageId {
            partition: delivery.partition,
            offset: delivery.offset,
        }
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.partition, self.offset)
    }
}

impl FromStr for MessageId {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad =
            || Error::InvalidArgument(format!("message id {text:?} is not <partition>-<offset>"));
        let (partition, offset) = text.split_once('-').ok_or_else(bad)?;
        Ok(MessageId {
            partition: partition.parse().map_err(|_| bad())?,
            offset: offset.parse().map_err(|_| bad())?,
        })
    }
}

/// The broker's acknowledgement of a published batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReceipt {
    /// What the acknowledgement promises (in memory, written, synced).
    pub durability: Durability,
    /// The ids, as runs of offsets, in the order the messages were given.
    pub ranges: Vec<OffsetRange>,
}

impl PublishReceipt {
    /// Number of messages acknowledged.
    pub fn len(&self) -> usize {
        self.ranges.iter().map(|r| r.count as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every message id, in message order.
    pub fn ids(&self) -> impl Iterator<Item = MessageId> + '_ {
        self.ranges.iter().flat_map(|r| {
            (r.offset..r.end()).map(move |offset| MessageId::new(r.partition, offset))
        })
    }

    pub fn first_id(&self) -> Option<MessageId> {
        self.ranges
            .first()
            .map(|r| MessageId::new(r.partition, r.offset))
    }

    fn from_frame(frame: Frame, expected: u32) -> Result<PublishReceipt> {
        match frame {
            Frame::Published { durability, ranges } => {
                let receipt = PublishReceipt { durability, ranges };
                if receipt.len() != expected as usize {
                    return Err(Error::UnexpectedResponse(format!(
                        "PUBLISHED acknowledges {} messages for a batch of {expected}",
                        receipt.len()
                    )));
                }
                Ok(receipt)
            }
            other => Err(Error::UnexpectedResponse(format!(
                "{} frame in answer to PUBLISH",
                other.name()
            ))),
        }
    }
}

/// A publish whose frame is queued (or already sent): await it for the receipt. Dropping it does
/// not retract the publish; it only stops waiting for the answer.
pub struct PendingPublish {
    response: PendingResponse,
    count: u32,
}

impl PendingPublish {
    pub(crate) fn new(response: PendingResponse, count: u32) -> Self {
        PendingPublish { response, count }
    }

    /// Messages in the batch.
    pub fn count(&self) -> u32 {
        self.count
    }
}

impl Future for PendingPublish {
    type Output = Result<PublishReceipt>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        Pin::new(&mut this.response)
            .poll(cx)
            .map(|answer| answer.and_then(|frame| PublishReceipt::from_frame(frame, this.count)))
    }
}

/// What [`crate::Client::send_encoded`] needs from a finished PUBLISH frame: its request id and
/// message count, read from the documented layout (header, topic as str16, partition u32, count
/// u32) and checked against the frame length.
pub(crate) fn inspect_publish_frame(frame: &Bytes) -> Result<(u32, u32)> {
    let bad = |why: &str| Error::InvalidArgument(format!("not a finished PUBLISH frame: {why}"));
    let header = FrameHeader::peek(frame)?.ok_or_else(|| bad("shorter than a frame header"))?;
    if header.opcode != opcode::PUBLISH {
        return Err(bad("wrong opcode"));
    }
    if header.frame_len() != frame.len() {
        return Err(bad("length field does not match the frame"));
    }
    let at = FRAME_HEADER_BYTES;
    let topic_len = frame
        .get(at..at + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
        .ok_or_else(|| bad("truncated"))?;
    let count_at = at + 2 + topic_len + 4;
    let count = frame
        .get(count_at..count_at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| bad("truncated"))?;
    if count == 0 || count > BATCH_COUNT_MAX {
        return Err(Error::InvalidMessage(format!(
            "a batch holds 1..={BATCH_COUNT_MAX} messages, this one {count}"
        )));
    }
    Ok((header.request_id, count))
}

#[cfg(test)]
mod tests {
    use ferrymq_protocol::{Message, PublishEncoder};

    use super::*;

    #[test]
    fn message_id_round_trips_through_text() {
        let id = MessageId::new(3, 1_234_567);
        assert_eq!(id.to_string(), "3-1234567");
        assert_eq!("3-1234567".parse::<MessageId>().unwrap(), id);
        assert!("3".parse::<MessageId>().is_err());
        assert!("a-1".parse::<MessageId>().is_err());
        assert!("1-".parse::<MessageId>().is_err());
    }

    #[test]
    fn receipt_lists_ids_in_message_order() {
        let receipt = PublishReceipt {
            durability: Durability::Memory,
            ranges: vec![
                OffsetRange {
                    partition: 1,
                    offset: 10,
                    count: 2,
                },
                OffsetRange::single(0, 4),
            ],
        };
        let ids: Vec<String> = receipt.ids().map(|id| id.to_string()).collect();
        assert_eq!(ids, ["1-10", "1-11", "0-4"]);
        assert_eq!(receipt.len(), 3);
        assert_eq!(receipt.first_id(), Some(MessageId::new(1, 10)));
    }

    #[test]
    fn receipt_with_the_wrong_count_is_refused() {
        let frame = Frame::Published {
            durability: Durability::Synced,
            ranges: vec![OffsetRange::single(0, 1)],
        };
        assert!(PublishReceipt::from_frame(frame.clone(), 1).is_ok());
        assert!(matches!(
            PublishReceipt::from_frame(frame, 2),
            Err(Error::UnexpectedResponse(_))
        ));
    }

    #[test]
    fn publish_frame_inspection_reads_id_and_count() {
        let mut encoder = PublishEncoder::new("orders", Some(2), 77);
        encoder.push(&Message::new("a")).unwrap();
        encoder.push_body(None, 0, b"b");
        let frame = encoder.finish();
        assert_eq!(inspect_publish_frame(&frame).unwrap(), (77, 2));
        assert!(inspect_publish_frame(&frame.slice(..frame.len() - 1)).is_err());
        let unanswered = PublishEncoder::new("orders", None, 0);
        assert!(
            inspect_publish_frame(&unanswered.finish()).is_err(),
            "id 0 and an empty batch are refused"
        );
    }
}
