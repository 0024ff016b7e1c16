//! Arbitrary bytes into the frame decoder, the code that faces untrusted peers: it must never
//! panic, and whatever it accepts must re-encode to exactly the bytes it came from.
#![no_main]

use bytes::BytesMut;
use ferrymq_protocol::{Frame, FrameDecoder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let decoder = FrameDecoder::new(1 << 20);
    let mut buf = BytesMut::from(data);
    // Bounded: every Ok(Some) consumes at least a 12-byte header.
    loop {
        let before = buf.clone();
        match decoder.decode(&mut buf) {
            Ok(Some((header, frame))) => {
                let consumed = before.len() - buf.len();
                let mut again = BytesMut::new();
                frame.encode(header.request_id, &mut again);
                assert_eq!(
                    &again[..],
                    &before[..consumed],
                    "{} does not re-encode to its bytes",
                    frame.name()
                );
                if let Frame::Publish { records, .. } = &frame {
                    // Every record of an accepted batch decodes to a message.
                    assert_eq!(records.messages().count() as u32, records.count());
                }
                if let Frame::Deliver { deliveries, .. } = &frame {
                    assert_eq!(deliveries.iter().count() as u32, deliveries.count());
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
});
