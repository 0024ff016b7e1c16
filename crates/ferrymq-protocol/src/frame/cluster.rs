//! CLUSTER_INFO and its reply: who the nodes are, where clients reach them, and who leads each
//! replicated partition. Version 3.

use bytes::{BufMut, BytesMut};

use super::cluster_info::{ClusterInfo, ClusterNodeEntry, PartitionLeader};
use super::header::{opcode, opcode_name};
use super::kind::Frame;
use crate::error::ProtocolError;
use crate::wire::{put_str16, Reader};

pub(super) fn encode(frame: &Frame, buf: &mut BytesMut) {
    match frame {
        Frame::ClusterInfo => {}
        Frame::ClusterInfoReply(info) => {
            buf.put_u64_le(info.node_id);
            buf.put_u64_le(info.metadata_leader);
            buf.put_u32_le(info.nodes.len() as u32);
            for node in &info.nodes {
                buf.put_u64_le(node.id);
                put_str16(buf, &node.addr);
            }
            buf.put_u32_le(info.partitions.len() as u32);
            for p in &info.partitions {
                put_str16(buf, &p.topic);
                buf.put_u32_le(p.partition);
                buf.put_u64_le(p.leader);
                assert!(p.replicas.len() <= u8::MAX as usize, "at most 255 replicas");
                buf.put_u8(p.replicas.len() as u8);
                for r in &p.replicas {
                    buf.put_u64_le(*r);
                }
            }
        }
        other => unreachable!("{} is not a cluster frame", other.name()),
    }
}

pub(super) fn decode(opcode: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        CLUSTER_INFO => Frame::ClusterInfo,
        CLUSTER_INFO_REPLY => {
            let node_id = r.u64("cluster_info_reply.node_id")?;
            let metadata_leader = r.u64("cluster_info_reply.metadata_leader")?;
            let count = r.u32("cluster_info_reply.node_count")?;
            let mut nodes = Vec::new();
            for _ in 0..count {
                nodes.push(ClusterNodeEntry {
                    id: r.u64("cluster_info_reply.node.id")?,
                    addr: r.str16("cluster_info_reply.node.addr")?,
                });
            }
            let count = r.u32("cluster_info_reply.partition_count")?;
            let mut partitions = Vec::new();
            for _ in 0..count {
                let topic = r.str16("cluster_info_reply.partition.topic")?;
                let partition = r.u32("cluster_info_reply.partition.partition")?;
                let leader = r.u64("cluster_info_reply.partition.leader")?;
                let n = r.u8("cluster_info_reply.partition.replica_count")?;
                let mut replicas = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    replicas.push(r.u64("cluster_info_reply.partition.replica")?);
                }
                partitions.push(PartitionLeader {
                    topic,
                    partition,
                    leader,
                    replicas,
                });
            }
            Frame::ClusterInfoReply(ClusterInfo {
                node_id,
                metadata_leader,
                nodes,
                partitions,
            })
        }
        other => unreachable!("{} is not a cluster opcode", opcode_name(other)),
    })
}
