//! The outgoing byte queue shared by every caller of one connection.
//!
//! Callers encode frames straight into `tail` under a short lock; a ready frame handed over as
//! `Bytes` (a finished publish batch) is queued as its own segment instead of being copied. The
//! writer task takes everything queued in one swap and writes it with one vectored write, so a
//! thousand small acks or a dozen publish batches cost one syscall.
//!
//! Acks coalesce: an ACK (or NACK with the same delay) for the same consumer as the frame just
//! before it in the queue is merged into that frame, and a range that continues the frame's last
//! range extends it. Acking message by message therefore costs a few bytes per message in one
//! frame per flush, not a frame per message. This patches the ACK layout of `docs/protocol.md`
//! (header, consumer id, [delay], range count, ranges of partition u32, offset u64, count u32);
//! the unit tests decode the result with the protocol crate.
//!
//! Invariants:
//! - Frames are queued whole and in the order callers appended them; segments and `tail` bytes are
//!   never reordered.
//! - `queued_bytes` is exactly the number of bytes waiting in the queue. The queue itself does not
//!   refuse data: the connection checks `queued_bytes` against its bound before appending (see
//!   `Connection::enqueue`).
//! - Once closed, the queue drops what it holds and refuses appends with the close reason.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use ferrymq_protocol::limits::{FRAME_HEADER_BYTES, RANGES_COUNT_MAX};
use ferrymq_protocol::{Frame, OffsetRange, OFFSET_RANGE_BYTES};

use crate::error::{Error, Result};

/// A ready frame smaller than this is copied into the tail rather than queued as a segment: a copy
/// of a few KiB is cheaper than an extra iovec and keeps the segment list short.
const SEGMENT_COPY_BYTES_MAX: usize = 4096;

#[derive(Debug)]
enum State {
    Open,
    /// `Client::close` was called: what is queued is still written, nothing new is accepted.
    Closing,
    Closed(Error),
}

#[derive(Debug)]
pub(crate) struct WriteQueue {
    tail: BytesMut,
    segments: VecDeque<Bytes>,
    queued_bytes: usize,
    state: State,
    /// Reused for ACK/NACK frames so that acking allocates nothing once warm.
    ranges_scratch: Vec<OffsetRange>,
    /// The ACK/NACK frame at the end of `tail` that later acks may extend; cleared by anything
    /// else appended and when the tail is taken.
    open_ack: Option<OpenAck>,
}

#[derive(Debug, Clone, Copy)]
struct OpenAck {
    /// Offset of the frame's header in `tail`.
    start: usize,
    consumer_id: u32,
    nack_delay_ms: Option<u32>,
}

impl WriteQueue {
    pub(crate) fn new() -> Self {
        WriteQueue {
            // Grows to the largest burst and is reused after that, until the connection idles.
            tail: BytesMut::new(),
            segments: VecDeque::new(),
            queued_bytes: 0,
            state: State::Open,
            ranges_scratch: Vec::new(),
            open_ack: None,
        }
    }

    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queued_bytes == 0
    }

    /// Fails with the close reason once the connection is closing or closed.
    pub(crate) fn check_open(&self) -> Result<()> {
        match &self.state {
            State::Open => Ok(()),
            State::Closing => Err(Error::ConnectionClosed),
            State::Closed(reason) => Err(reason.clone()),
        }
    }

    pub(crate) fn is_closing(&self) -> bool {
        matches!(self.state, State::Closing)
    }

    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed(_))
    }

    pub(crate) fn begin_close(&mut self) {
        if matches!(self.state, State::Open) {
            self.state = State::Closing;
        }
    }

    pub(crate) fn close(&mut self, reason: Error) {
        self.state = State::Closed(reason);
        self.open_ack = None;
        self.tail.clear();
        self.segments.clear();
        self.queued_bytes = 0;
    }

    /// Drops the buffers' capacity; called when the connection has been idle for a heartbeat
    /// interval, so idle connections hold no write memory.
    pub(crate) fn release_idle_memory(&mut self) {
        if self.is_empty() {
            self.tail = BytesMut::new();
            self.segments = VecDeque::new();
            self.ranges_scratch = Vec::new();
            self.open_ack = None;
        }
    }

    /// Appends one encoded frame.
    pub(crate) fn push_frame(&mut self, frame: &Frame, request_id: u32) {
        self.open_ack = None;
        let before = self.tail.len();
        frame.encode(request_id, &mut self.tail);
        self.queued_bytes += self.tail.len() - before;
    }

    /// Appends an ACK (`nack_delay_ms: None`) or NACK frame for `ranges`, merged into the ACK
    /// just before it when possible, without allocating.
    pub(crate) fn push_ack(
        &mut self,
        consumer_id: u32,
        nack_delay_ms: Option<u32>,
        ranges: &[OffsetRange],
    ) {
        if ranges.is_empty() || self.extend_open_ack(consumer_id, nack_delay_ms, ranges) {
            return;
        }
        let start = self.tail.len();
        let mut scratch = std::mem::take(&mut self.ranges_scratch);
        scratch.clear();
        scratch.extend_from_slice(ranges);
        let frame = match nack_delay_ms {
            None => Frame::Ack {
                consumer_id,
                ranges: scratch,
            },
            Some(delay_ms) => Frame::Nack {
                consumer_id,
                delay_ms,
                dead_letter: false,
                release: false,
                reason: String::new(),
                ranges: scratch,
            },
        };
        self.push_frame(&frame, 0);
        if let Frame::Ack { ranges, .. } | Frame::Nack { ranges, .. } = frame {
            self.ranges_scratch = ranges;
        }
        self.open_ack = Some(OpenAck {
            start,
            consumer_id,
            nack_delay_ms,
        });
    }

    /// Merges `ranges` into the open ACK frame at the end of the tail; false when there is none
    /// for this consumer and delay, or the merged frame would exceed the range limit.
    fn extend_open_ack(
        &mut self,
        consumer_id: u32,
        nack_delay_ms: Option<u32>,
        ranges: &[OffsetRange],
    ) -> bool {
        let Some(open) = self.open_ack else {
            return false;
        };
        if open.consumer_id != consumer_id || open.nack_delay_ms != nack_delay_ms {
            return false;
        }
        // ACK: consumer id, then the ranges. NACK: consumer id, delay, flags (0) and an empty
        // reason (2 bytes) before them: lazily merged nacks never dead-letter or give a reason.
        let count_at = open.start
            + FRAME_HEADER_BYTES
            + 4
            + if nack_delay_ms.is_some() {
                4 + 1 + 2
            } else {
                0
            };
        let mut count = read_u32(&self.tail, count_at);
        if count as usize + ranges.len() > RANGES_COUNT_MAX as usize {
            return false;
        }
        let before = self.tail.len();
        for range in ranges {
            let last_at = self.tail.len() - OFFSET_RANGE_BYTES;
            let last_partition = read_u32(&self.tail, last_at);
            let last_offset = read_u64(&self.tail, last_at + 4);
            let last_count = read_u32(&self.tail, last_at + 12);
            let continues = count > 0
                && last_partition == range.partition
                && last_offset.checked_add(last_count as u64) == Some(range.offset)
                && last_count.checked_add(range.count).is_some();
            if continues {
                self.tail[last_at + 12..last_at + 16]
                    .copy_from_slice(&(last_count + range.count).to_le_bytes());
            } else {
                self.tail.put_u32_le(range.partition);
                self.tail.put_u64_le(range.offset);
                self.tail.put_u32_le(range.count);
                count += 1;
            }
        }
        self.tail[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
        let payload_len = (self.tail.len() - open.start - FRAME_HEADER_BYTES) as u32;
        self.tail[open.start..open.start + 4].copy_from_slice(&payload_len.to_le_bytes());
        self.queued_bytes += self.tail.len() - before;
        true
    }

    /// Appends a complete frame that was encoded elsewhere.
    pub(crate) fn push_bytes(&mut self, frame: Bytes) {
        self.open_ack = None;
        self.queued_bytes += frame.len();
        if frame.len() <= SEGMENT_COPY_BYTES_MAX {
            self.tail.extend_from_slice(&frame);
            return;
        }
        if !self.tail.is_empty() {
            self.segments.push_back(self.tail.split().freeze());
        }
        self.segments.push_back(frame);
    }

    /// Moves everything queued into `out`, in order, leaving the queue empty.
    pub(crate) fn take_into(&mut self, out: &mut OutQueue) {
        self.open_ack = None;
        out.remaining += self.queued_bytes;
        out.segments.append(&mut self.segments);
        if !self.tail.is_empty() {
            out.segments.push_back(self.tail.split().freeze());
        }
        // `split` left the spare capacity here; once the writer has dropped the frozen bytes,
        // growing the tail reclaims the same allocation instead of making a new one.
        self.queued_bytes = 0;
    }
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(bytes)
}

fn read_u64(buf: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(bytes)
}

/// The bytes the writer task is writing: a list of segments consumed front to back, written with
/// vectored I/O.
#[derive(Debug, Default)]
pub(crate) struct OutQueue {
    segments: VecDeque<Bytes>,
    remaining: usize,
}

impl Buf for OutQueue {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.segments.front().map_or(&[], |s| s.as_ref())
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slot, segment) in dst.iter_mut().zip(self.segments.iter()) {
            *slot = IoSlice::new(segment);
            n += 1;
        }
        n
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(
            cnt <= self.remaining,
            "advance past the end of the out queue"
        );
        self.remaining -= cnt;
        while cnt > 0 {
            let Some(front) = self.segments.front_mut() else {
                break;
            };
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.segments.pop_front();
        }
    }
}

/// Everything queued, as the bytes the writer would send (tests read frames back from it).
#[cfg(test)]
pub(crate) fn drain(queue: &mut WriteQueue) -> Vec<u8> {
    let mut out = OutQueue::default();
    queue.take_into(&mut out);
    let mut bytes = Vec::new();
    while out.has_remaining() {
        let chunk = out.chunk().to_vec();
        out.advance(chunk.len());
        bytes.extend(chunk);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use ferrymq_protocol::{FrameDecoder, PublishEncoder};

    use super::*;

    #[test]
    fn frames_and_segments_come_out_in_order() {
        let mut queue = WriteQueue::new();
        queue.push_frame(&Frame::Ping, 1);
        let mut big = PublishEncoder::new("t", None, 2);
        for _ in 0..100 {
            big.push_body(None, 0, &[7u8; 100]);
        }
        let big = big.finish();
        assert!(big.len() > SEGMENT_COPY_BYTES_MAX);
        queue.push_bytes(big.clone());
        queue.push_ack(
            9,
            None,
            &[OffsetRange {
                partition: 0,
                offset: 5,
                count: 3,
            }],
        );
        queue.push_ack(9, Some(100), &[OffsetRange::single(1, 1)]);
        assert_eq!(
            queue.queued_bytes(),
            12 + big.len() + (12 + 4 + 4 + 16) + (12 + 4 + 4 + 1 + 2 + 4 + 16)
        );

        let mut bytes = BytesMut::from(&drain(&mut queue)[..]);
        assert!(queue.is_empty());
        let decoder = FrameDecoder::new(1 << 20);
        let mut seen = Vec::new();
        while let Some((header, frame)) = decoder.decode(&mut bytes).unwrap() {
            seen.push((header.request_id, frame.name()));
        }
        assert!(bytes.is_empty());
        assert_eq!(
            seen,
            vec![(1, "PING"), (2, "PUBLISH"), (0, "ACK"), (0, "NACK")]
        );
    }

    fn decode_all(queue: &mut WriteQueue) -> Vec<(u32, Frame)> {
        let mut bytes = BytesMut::from(&drain(queue)[..]);
        let decoder = FrameDecoder::new(1 << 20);
        let mut frames = Vec::new();
        while let Some((header, frame)) = decoder.decode(&mut bytes).unwrap() {
            frames.push((header.request_id, frame));
        }
        assert!(bytes.is_empty(), "no bytes outside frames");
        frames
    }

    #[test]
    fn consecutive_acks_merge_into_one_frame() {
        let mut queue = WriteQueue::new();
        for offset in 0..100 {
            queue.push_ack(1, None, &[OffsetRange::single(0, offset)]);
        }
        queue.push_ack(
            1,
            None,
            &[
                OffsetRange::single(0, 200),
                OffsetRange {
                    partition: 1,
                    offset: 5,
                    count: 2,
                },
            ],
        );
        queue.push_ack(1, None, &[OffsetRange::single(1, 7)]);
        let one_frame = 12 + 4 + 4 + 3 * 16;
        assert_eq!(queue.queued_bytes(), one_frame);
        let frames = decode_all(&mut queue);
        assert_eq!(
            frames,
            vec![(
                0,
                Frame::Ack {
                    consumer_id: 1,
                    ranges: vec![
                        OffsetRange {
                            partition: 0,
                            offset: 0,
                            count: 100
                        },
                        OffsetRange::single(0, 200),
                        OffsetRange {
                            partition: 1,
                            offset: 5,
                            count: 3
                        },
                    ]
                }
            )]
        );
    }

    #[test]
    fn acks_merge_only_with_the_frame_just_before_them() {
        let mut queue = WriteQueue::new();
        queue.push_ack(1, None, &[OffsetRange::single(0, 1)]);
        queue.push_ack(2, None, &[OffsetRange::single(0, 2)]);
        queue.push_ack(2, Some(50), &[OffsetRange::single(0, 3)]);
        queue.push_ack(2, Some(50), &[OffsetRange::single(0, 4)]);
        queue.push_frame(
            &Frame::Credit {
                consumer_id: 2,
                credit: 10,
            },
            0,
        );
        queue.push_ack(2, Some(50), &[OffsetRange::single(0, 5)]);
        let frames: Vec<Frame> = decode_all(&mut queue)
            .into_iter()
            .map(|(_, frame)| frame)
            .collect();
        assert_eq!(
            frames,
            vec![
                Frame::Ack {
                    consumer_id: 1,
                    ranges: vec![OffsetRange::single(0, 1)]
                },
                Frame::Ack {
                    consumer_id: 2,
                    ranges: vec![OffsetRange::single(0, 2)]
                },
                Frame::Nack {
                    consumer_id: 2,
                    delay_ms: 50,
                    dead_letter: false,
                    release: false,
                    reason: String::new(),
                    ranges: vec![OffsetRange {
                        partition: 0,
                        offset: 3,
                        count: 2
                    }]
                },
                Frame::Credit {
                    consumer_id: 2,
                    credit: 10
                },
                Frame::Nack {
                    consumer_id: 2,
                    delay_ms: 50,
                    dead_letter: false,
                    release: false,
                    reason: String::new(),
                    ranges: vec![OffsetRange::single(0, 5)]
                },
            ]
        );
        // After the writer took the queue, a new ack starts a new frame.
        queue.push_ack(2, Some(50), &[OffsetRange::single(0, 6)]);
        assert_eq!(decode_all(&mut queue).len(), 1);
    }

    #[test]
    fn partial_writes_advance_across_segments() {
        let mut queue = WriteQueue::new();
        queue.push_bytes(Bytes::from(vec![1u8; 5000]));
        queue.push_frame(&Frame::Pong, 3);
        queue.push_bytes(Bytes::from(vec![2u8; 6000]));
        let mut out = OutQueue::default();
        queue.take_into(&mut out);
        let total = out.remaining();
        assert_eq!(total, 5000 + 12 + 6000);
        let mut slices = [IoSlice::new(&[]); 8];
        assert_eq!(out.chunks_vectored(&mut slices), 3);
        out.advance(4999);
        assert_eq!(out.chunk(), &[1u8]);
        out.advance(1 + 12 + 10);
        assert_eq!(out.chunk().len(), 5990);
        out.advance(5990);
        assert!(!out.has_remaining());
    }

    #[test]
    fn an_idle_queue_gives_its_memory_back() {
        let mut queue = WriteQueue::new();
        queue.push_bytes(Bytes::from(vec![1u8; 100_000]));
        queue.push_frame(&Frame::Ping, 0);
        queue.release_idle_memory();
        assert_eq!(queue.queued_bytes(), 100_000 + 12, "queued frames are kept");
        drain(&mut queue);
        queue.release_idle_memory();
        assert_eq!(queue.tail.capacity(), 0);
        queue.push_ack(1, None, &[OffsetRange::single(0, 1)]);
        assert_eq!(decode_all(&mut queue).len(), 1, "usable afterwards");
    }

    #[test]
    fn closed_queue_refuses_and_drops_data() {
        let mut queue = WriteQueue::new();
        queue.push_frame(&Frame::Ping, 0);
        queue.begin_close();
        assert!(matches!(queue.check_open(), Err(Error::ConnectionClosed)));
        assert!(!queue.is_empty(), "closing still writes what was queued");
        queue.close(Error::Timeout("x".into()));
        assert!(queue.is_empty());
        assert!(matches!(queue.check_open(), Err(Error::Timeout(_))));
    }
}
