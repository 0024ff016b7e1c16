//! The outgoing byte queue shared by every caller of one connection.
//!
//! Callers encode frames straight into `tail` under a short lock; a ready frame handed over as
//! `Bytes` (a finished publish batch) is queued as its own segment instead of being copied. The
//! writer task takes everything queued in one swap and writes it with one vectored write, so a
//! thousand small acks or a dozen publish batches cost one syscall.
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

use bytes::{Buf, Bytes, BytesMut};
use ferrymq_protocol::{Frame, OffsetRange};

use crate::error::{Error, Result};

/// A ready frame smaller than this is copied into the tail rather than queued as a segment: a copy
/// of a few KiB is cheaper than an extra iovec and keeps the segment list short.
const SEGMENT_COPY_BYTES_MAX: usize = 4096;

/// Initial capacity of the tail; it grows to the largest burst and is reused after that.
const TAIL_BYTES_INITIAL: usize = 64 * 1024;

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
}

impl WriteQueue {
    pub(crate) fn new() -> Self {
        WriteQueue {
            tail: BytesMut::with_capacity(TAIL_BYTES_INITIAL),
            segments: VecDeque::new(),
            queued_bytes: 0,
            state: State::Open,
            ranges_scratch: Vec::new(),
        }
    }

    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    #[cfg(test)]
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
        self.tail.clear();
        self.segments.clear();
        self.queued_bytes = 0;
    }

    /// Appends one encoded frame.
    pub(crate) fn push_frame(&mut self, frame: &Frame, request_id: u32) {
        let before = self.tail.len();
        frame.encode(request_id, &mut self.tail);
        self.queued_bytes += self.tail.len() - before;
    }

    /// Appends an ACK (`nack_delay_ms: None`) or NACK frame for `ranges` without allocating.
    pub(crate) fn push_ack(
        &mut self,
        consumer_id: u32,
        nack_delay_ms: Option<u32>,
        ranges: &[OffsetRange],
    ) {
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
                ranges: scratch,
            },
        };
        self.push_frame(&frame, 0);
        if let Frame::Ack { ranges, .. } | Frame::Nack { ranges, .. } = frame {
            self.ranges_scratch = ranges;
        }
    }

    /// Appends a complete frame that was encoded elsewhere.
    pub(crate) fn push_bytes(&mut self, frame: Bytes) {
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

#[cfg(test)]
mod tests {
    use ferrymq_protocol::{FrameDecoder, PublishEncoder};

    use super::*;

    fn drain(queue: &mut WriteQueue) -> Vec<u8> {
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
            12 + big.len() + (12 + 4 + 4 + 16) + (12 + 4 + 4 + 4 + 16)
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
