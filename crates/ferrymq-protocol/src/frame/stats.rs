//! STATS and its reply STATS_REPLY.

use bytes::{BufMut, BytesMut};

use super::header::{opcode, opcode_name};
use super::kind::Frame;
use super::topic_stats::{decode_topic_stats, encode_topic_stats};
use crate::error::ProtocolError;
use crate::wire::{put_str16, Reader};

/// Writes the payload of a stats frame in the layout of protocol `version`.
pub(super) fn encode(frame: &Frame, version: u16, buf: &mut BytesMut) {
    match frame {
        Frame::Stats { topic } => put_str16(buf, topic),
        Frame::StatsReply { topics } => {
            buf.put_u32_le(topics.len() as u32);
            for t in topics {
                encode_topic_stats(t, version, buf);
            }
        }
        other => unreachable!("{} is not a stats frame", other.name()),
    }
}

/// Reads the payload of a stats frame (`opcode` is one of them) written in the layout of
/// protocol `version`.
pub(super) fn decode(opcode: u16, version: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        STATS => Frame::Stats {
            topic: r.str16("stats.topic")?,
        },
        STATS_REPLY => {
            let count = r.u32("stats_reply.count")?;
            let mut topics = Vec::with_capacity(count.min(1024) as usize);
            for _ in 0..count {
                topics.push(decode_topic_stats(r, version)?);
            }
            Frame::StatsReply { topics }
        }
        other => unreachable!("{} is not a stats opcode", opcode_name(other)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_codec;
    use super::*;
    use crate::frame::{SubscriptionStats, TopicStats};
    use crate::latency::Latency;

    #[test]
    fn each_frame_roundtrips_and_every_shorter_payload_is_refused() {
        for frame in [
            Frame::Stats {
                topic: "orders".into(),
            },
            Frame::StatsReply {
                topics: vec![TopicStats {
                    name: "orders".into(),
                    messages_in: 10,
                    depth: 3,
                    publishers: 1,
                    subscriptions: vec![SubscriptionStats {
                        name: "billing".into(),
                        ephemeral: true,
                        consumers: 2,
                        acked: 7,
                        deliver_latency: Latency {
                            sum_us: 90,
                            buckets: vec![(1, 2), (5, 1)],
                        },
                        paused: true,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            },
        ] {
            assert_codec(&frame);
        }
    }

    #[test]
    fn paused_is_carried_from_version_3_on() {
        use crate::frame::FrameHeader;
        use crate::limits::FRAME_HEADER_BYTES;
        let reply = Frame::StatsReply {
            topics: vec![TopicStats {
                name: "orders".into(),
                subscriptions: vec![SubscriptionStats {
                    name: "billing".into(),
                    paused: true,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let written = |version: u16| {
            let mut buf = BytesMut::new();
            reply.encode_as(version, 1, &mut buf);
            let header = FrameHeader::peek(&buf).unwrap().unwrap();
            let payload = buf.split_off(FRAME_HEADER_BYTES).freeze();
            (
                payload.len(),
                Frame::decode_as(version, &header, payload).unwrap(),
            )
        };
        let (v3_len, v3) = written(3);
        assert_eq!(v3, reply);
        let (v2_len, v2) = written(2);
        assert_eq!(v2_len + 1, v3_len, "version 2 has no paused byte");
        let Frame::StatsReply { topics } = v2 else {
            panic!("not a reply")
        };
        assert!(!topics[0].subscriptions[0].paused);
    }
}
