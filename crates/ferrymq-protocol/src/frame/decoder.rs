//! Splitting frames off a read buffer.

use bytes::BytesMut;

use super::header::FrameHeader;
use super::kind::Frame;
use crate::error::ProtocolError;
use crate::limits::{FRAME_HEADER_BYTES, PROTOCOL_VERSION};

/// Splits frames off a growing read buffer. Sans-IO: the caller reads bytes into `buf` however it
/// likes and calls [`FrameDecoder::decode`] until it returns `Ok(None)`.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    frame_bytes_max: usize,
}

impl FrameDecoder {
    pub fn new(frame_bytes_max: usize) -> Self {
        assert!(frame_bytes_max >= FRAME_HEADER_BYTES);
        FrameDecoder { frame_bytes_max }
    }

    /// Checks the header as soon as it is complete, so an oversize frame is refused before its
    /// body is buffered, then decodes the whole frame once it has arrived.
    pub fn decode(
        &self,
        buf: &mut BytesMut,
    ) -> Result<Option<(FrameHeader, Frame)>, ProtocolError> {
        self.decode_as(PROTOCOL_VERSION, buf)
    }

    /// As [`FrameDecoder::decode`], for frames in the layout of protocol `version`.
    pub fn decode_as(
        &self,
        version: u16,
        buf: &mut BytesMut,
    ) -> Result<Option<(FrameHeader, Frame)>, ProtocolError> {
        let Some(header) = FrameHeader::peek(buf)? else {
            return Ok(None);
        };
        if header.frame_len() > self.frame_bytes_max {
            return Err(ProtocolError::FrameTooLarge {
                len: header.frame_len(),
                max: self.frame_bytes_max,
            });
        }
        if buf.len() < header.frame_len() {
            buf.reserve(header.frame_len() - buf.len());
            return Ok(None);
        }
        let mut frame = buf.split_to(header.frame_len());
        let payload = frame.split_off(FRAME_HEADER_BYTES).freeze();
        Frame::decode_as(version, &header, payload).map(|f| Some((header, f)))
    }
}
