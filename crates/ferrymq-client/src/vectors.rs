//! The golden vectors of `protocol/vectors.json` against the parts of this client that read or
//! write the wire layout themselves instead of going through the protocol crate: ACK/NACK
//! coalescing in the write queue, the borrowed delivery walker, and PUBLISH frame inspection.

use bytes::BytesMut;
use ferrymq_protocol::{DeliveryBatch, Frame, FrameDecoder, OffsetRange};
use serde_json::Value;

use crate::publish::inspect_publish_frame;
use crate::view::DeliveryBatchExt;
use crate::write_queue::{drain, WriteQueue};

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../protocol/vectors.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).expect("vectors.json is JSON")
}

fn vector(all: &Value, name: &str) -> Value {
    all["vectors"]
        .as_array()
        .expect("a vectors array")
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no vector named {name}"))
        .clone()
}

fn hex_bytes(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn frame_bytes(v: &Value) -> Vec<u8> {
    hex_bytes(v["hex"].as_str().expect("hex string"))
}

/// A u64 field: a JSON number, or a decimal string above 2^53.
fn u64_field(v: &Value) -> u64 {
    match v {
        Value::String(text) => text.parse().expect("decimal u64"),
        other => other.as_u64().expect("u64 number"),
    }
}

/// A byte string: `{"utf8": ...}` or `{"hex": ...}`; `None` for null.
fn byte_string(v: &Value) -> Option<Vec<u8>> {
    if v.is_null() {
        return None;
    }
    if let Some(text) = v["utf8"].as_str() {
        return Some(text.as_bytes().to_vec());
    }
    Some(hex_bytes(v["hex"].as_str().expect("utf8 or hex")))
}

fn ranges(v: &Value) -> Vec<OffsetRange> {
    v.as_array()
        .expect("ranges array")
        .iter()
        .map(|r| OffsetRange {
            partition: r["partition"].as_u64().expect("partition") as u32,
            offset: u64_field(&r["offset"]),
            count: r["count"].as_u64().expect("count") as u32,
        })
        .collect()
}

/// Everything but the request id (bytes 8..12), which the client always sends as 0 for acks.
fn without_request_id(frame: &[u8]) -> Vec<u8> {
    let mut bytes = frame.to_vec();
    bytes[8..12].fill(0);
    bytes
}

#[test]
fn acks_pushed_one_range_at_a_time_match_the_vectors() {
    let all = vectors();
    for name in [
        "ack_one_range",
        "ack_many_ranges",
        "nack_now",
        "nack_delayed",
    ] {
        let v = vector(&all, name);
        let fields = &v["fields"];
        let consumer_id = fields["consumer_id"].as_u64().expect("consumer_id") as u32;
        let delay = fields
            .get("delay_ms")
            .map(|d| d.as_u64().expect("delay_ms") as u32);
        let mut queue = WriteQueue::new();
        // One call per range: the coalescing path builds the frame the vector describes
        // (no two ranges of these vectors continue each other).
        for range in ranges(&fields["ranges"]) {
            queue.push_ack(consumer_id, delay, &[range]);
        }
        assert_eq!(
            drain(&mut queue),
            without_request_id(&frame_bytes(&v)),
            "vector {name}"
        );
    }
}

#[test]
fn delivery_views_read_the_deliver_vector() {
    let all = vectors();
    let v = vector(&all, "deliver_batch");
    let mut buf = BytesMut::from(&frame_bytes(&v)[..]);
    let (_, frame) = FrameDecoder::new(1 << 24)
        .decode(&mut buf)
        .expect("valid")
        .expect("whole frame");
    let Frame::Deliver { deliveries, .. } = frame else {
        panic!("expected DELIVER")
    };
    let batch: &DeliveryBatch = &deliveries;
    let expected = v["fields"]["deliveries"].as_array().expect("deliveries");
    let views: Vec<_> = batch.views().collect();
    assert_eq!(views.len(), expected.len());
    for (view, want) in views.iter().zip(expected) {
        let message = &want["message"];
        assert_eq!(
            view.partition as u64,
            want["partition"].as_u64().expect("partition")
        );
        assert_eq!(view.offset, u64_field(&want["offset"]));
        assert_eq!(view.timestamp_ms, u64_field(&want["timestamp_ms"]));
        assert_eq!(
            view.attempt as u64,
            want["attempt"].as_u64().expect("attempt")
        );
        assert_eq!(
            view.priority as u64,
            message["priority"].as_u64().expect("priority")
        );
        assert_eq!(view.deliver_after_ms, message["deliver_after_ms"].as_u64());
        assert_eq!(view.key.map(<[u8]>::to_vec), byte_string(&message["key"]));
        assert_eq!(Some(view.body.to_vec()), byte_string(&message["body"]));
        let headers: Vec<Value> = view
            .headers()
            .map(|(name, value)| Value::from(vec![name.to_string(), value.to_string()]))
            .collect();
        assert_eq!(&Value::from(headers), &message["headers"]);
    }
}

#[test]
fn publish_inspection_reads_the_publish_vectors() {
    let all = vectors();
    for name in [
        "publish_one_minimal",
        "publish_key_headers_priority_delay",
        "publish_explicit_partition_empty_key",
    ] {
        let v = vector(&all, name);
        let frame = bytes::Bytes::from(frame_bytes(&v));
        let (request_id, count) = inspect_publish_frame(&frame).expect("a publish frame");
        assert_eq!(
            request_id as u64,
            v["request_id"].as_u64().expect("request_id"),
            "vector {name}"
        );
        assert_eq!(
            count as usize,
            v["fields"]["messages"].as_array().expect("messages").len(),
            "vector {name}"
        );
    }
}
