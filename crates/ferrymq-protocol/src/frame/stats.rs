//! STATS and its reply STATS_REPLY.

use bytes::{BufMut, BytesMut};

use super::header::{opcode, opcode_name};
use super::kind::Frame;
use super::topic_stats::{decode_topic_stats, encode_topic_stats};
use crate::error::ProtocolError;
use crate::wire::{put_str16, Reader};

/// Writes the payload of a stats frame.
pub(super) fn encode(frame: &Frame, buf: &mut BytesMut) {
    match frame {
        Frame::Stats { topic } => put_str16(buf, topic),
        Frame::StatsReply { topics } => {
            buf.put_u32_le(topics.len() as u32);
            for t in topics {
                encode_topic_stats(t, buf);
            }
        }
        other => unreachable!("{} is not a stats frame", other.name()),
    }
}

/// Reads the payload of a stats frame (`opcode` is one of them).
pub(super) fn decode(opcode: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        STATS => Frame::Stats {
            topic: r.str16("stats.topic")?,
        },
        STATS_REPLY => {
            let count = r.u32("stats_reply.count")?;
            let mut topics = Vec::with_capacity(count.min(1024) as usize);
            for _ in 0..count {
                topics.push(decode_topic_stats(r)?);
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
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            },
        ] {
            assert_codec(&frame);
        }
    }
}
