//! What every frame family's tests check: a frame survives its encoding, its header tells its
//! exact size, and every shorter payload is refused rather than read as another frame.

use bytes::BytesMut;

use super::header::FrameHeader;
use super::kind::Frame;
use crate::limits::FRAME_HEADER_BYTES;

pub(super) fn assert_codec(frame: &Frame) {
    let name = frame.name();
    let mut buf = BytesMut::new();
    frame.encode(7, &mut buf);
    let header = FrameHeader::peek(&buf)
        .expect("a valid header")
        .expect("a whole header");
    assert_eq!(header.frame_len(), buf.len(), "{name}: the header's length");
    assert_eq!(header.opcode, frame.opcode(), "{name}: the opcode");
    assert_eq!(header.request_id, 7, "{name}: the request id");
    let payload = buf.split_off(FRAME_HEADER_BYTES).freeze();
    let decoded = Frame::decode(&header, payload.clone());
    assert_eq!(decoded.as_ref(), Ok(frame), "{name}: the roundtrip");
    for cut in 0..payload.len() {
        let short = FrameHeader {
            payload_len: cut as u32,
            ..header
        };
        let result = Frame::decode(&short, payload.slice(..cut));
        assert!(
            result.is_err(),
            "{name}: a payload cut to {cut} of {} bytes decoded as {result:?}",
            payload.len()
        );
    }
}
