//! CREATE_TOPIC, DELETE_TOPIC, LIST_TOPICS, DESCRIBE_TOPIC and their replies TOPIC_LIST and
//! TOPIC_INFO.

use bytes::{BufMut, BytesMut};

use super::fields::{read_flags, read_name};
use super::header::{opcode, opcode_name};
use super::kind::Frame;
use super::topic_config::{
    decode_topic_config, decode_topic_info, encode_topic_config, encode_topic_info,
};
use crate::error::ProtocolError;
use crate::wire::{put_str16, Reader};

const CREATE_FLAG_IF_NOT_EXISTS: u8 = 1;

/// Writes the payload of a topics frame.
pub(super) fn encode(frame: &Frame, version: u16, buf: &mut BytesMut) {
    match frame {
        Frame::ListTopics => {}
        Frame::CreateTopic {
            name,
            config,
            if_not_exists,
        } => {
            put_str16(buf, name);
            encode_topic_config(config, version, buf);
            buf.put_u8(if *if_not_exists {
                CREATE_FLAG_IF_NOT_EXISTS
            } else {
                0
            });
        }
        Frame::DeleteTopic { name } | Frame::DescribeTopic { name } => put_str16(buf, name),
        Frame::TopicList { topics } => {
            buf.put_u32_le(topics.len() as u32);
            for t in topics {
                encode_topic_info(t, version, buf);
            }
        }
        Frame::TopicInfo(t) => encode_topic_info(t, version, buf),
        other => unreachable!("{} is not a topics frame", other.name()),
    }
}

/// Reads the payload of a topics frame (`opcode` is one of them).
pub(super) fn decode(opcode: u16, version: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        CREATE_TOPIC => Frame::CreateTopic {
            name: read_name(r, "create_topic.name")?,
            config: decode_topic_config(r, version)?,
            if_not_exists: read_flags(r, "create_topic.flags", CREATE_FLAG_IF_NOT_EXISTS)? != 0,
        },
        DELETE_TOPIC => Frame::DeleteTopic {
            name: read_name(r, "delete_topic.name")?,
        },
        LIST_TOPICS => Frame::ListTopics,
        DESCRIBE_TOPIC => Frame::DescribeTopic {
            name: read_name(r, "describe_topic.name")?,
        },
        TOPIC_LIST => {
            let count = r.u32("topic_list.count")?;
            let mut topics = Vec::with_capacity(count.min(1024) as usize);
            for _ in 0..count {
                topics.push(decode_topic_info(r, version)?);
            }
            Frame::TopicList { topics }
        }
        TOPIC_INFO => Frame::TopicInfo(decode_topic_info(r, version)?),
        other => unreachable!("{} is not a topics opcode", opcode_name(other)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_codec;
    use super::*;
    use crate::frame::{FsyncPolicy, OverflowPolicy, Storage, TopicConfig, TopicInfo};
    use crate::RetentionPolicy;

    fn sample_config() -> TopicConfig {
        TopicConfig {
            partitions: 4,
            storage: Storage::Disk,
            overflow: OverflowPolicy::Reject,
            max_messages: 1000,
            max_bytes: 1 << 20,
            fsync: FsyncPolicy::IntervalMs(5),
            retention_ms: 60_000,
            retention_policy: RetentionPolicy::WorkQueue,
            dedup_window_ms: 30_000,
            replicas: 3,
        }
    }

    fn sample_info() -> TopicInfo {
        TopicInfo {
            name: "orders".into(),
            config: sample_config(),
            messages: 12,
            bytes: 3400,
            subscriptions: vec!["billing".into(), "audit".into()],
        }
    }

    #[test]
    fn each_frame_roundtrips_and_every_shorter_payload_is_refused() {
        for frame in [
            Frame::CreateTopic {
                name: "orders".into(),
                config: sample_config(),
                if_not_exists: true,
            },
            Frame::DeleteTopic {
                name: "orders".into(),
            },
            Frame::ListTopics,
            Frame::DescribeTopic {
                name: "orders".into(),
            },
            Frame::TopicList {
                topics: vec![sample_info(), sample_info()],
            },
            Frame::TopicInfo(sample_info()),
        ] {
            assert_codec(&frame);
        }
    }

    #[test]
    fn each_version_has_its_config_length_and_version_1_no_default_values() {
        use crate::frame::FrameHeader;
        use crate::limits::FRAME_HEADER_BYTES;
        let frame = Frame::CreateTopic {
            name: "orders".into(),
            config: sample_config(),
            if_not_exists: true,
        };
        for (version, config_bytes) in [(1, 35), (2, 44), (3, 45)] {
            let mut buf = BytesMut::new();
            frame.encode_as(version, 1, &mut buf);
            assert_eq!(buf.len(), FRAME_HEADER_BYTES + 2 + 6 + config_bytes + 1);
            let header = FrameHeader::peek(&buf).unwrap().unwrap();
            let payload = buf.split_off(FRAME_HEADER_BYTES).freeze();
            let decoded = Frame::decode_as(version, &header, payload.clone()).unwrap();
            let Frame::CreateTopic { config, .. } = decoded else {
                panic!("{decoded:?}")
            };
            if version == 1 {
                // What version 1 cannot say reads as the server's default.
                assert_eq!(config.retention_policy, RetentionPolicy::Default);
                assert_eq!(config.dedup_window_ms, 0);
                // And a newer reader refuses version 1's shorter frame.
                assert!(Frame::decode(&header, payload).is_err());
            } else if version == 2 {
                // Version 2 has no replicas: the server's default.
                assert_eq!(config.replicas, 0);
                assert_eq!(config.dedup_window_ms, sample_config().dedup_window_ms);
            } else {
                assert_eq!(config, sample_config());
            }
        }
        // `default` storage and overflow do not exist in version 1: written as its unset values.
        let unset = Frame::CreateTopic {
            name: "t".into(),
            config: TopicConfig::default(),
            if_not_exists: false,
        };
        let mut buf = BytesMut::new();
        unset.encode_as(1, 1, &mut buf);
        let config_at = FRAME_HEADER_BYTES + 2 + 1;
        assert_eq!(
            &buf[config_at + 4..config_at + 6],
            &[0, 0],
            "memory, drop_oldest"
        );
    }
}
