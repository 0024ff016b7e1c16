//! Statistics as JSON: `GET /stats`, `GET /topics/{topic}/stats` and `ferrymq stats --json`.

use ferrymq_protocol::{SubscriptionStats, TopicStats};
use serde::Serialize;

/// Statistics of one subscription.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SubscriptionStatsJson {
    pub name: String,
    pub ephemeral: bool,
    pub consumers: u32,
    pub messages_out: u64,
    pub bytes_out: u64,
    /// Messages not yet delivered (including those waiting for redelivery).
    pub backlog: u64,
    pub in_flight: u64,
    pub acked: u64,
    pub redelivered: u64,
    /// Messages given up (moved to the dead-letter topic).
    pub gave_up: u64,
    /// From publish (or the end of a message's delay) to its first delivery.
    pub deliver_latency_us: LatencyJson,
    /// From publish (or the end of a message's delay) to its ack, redeliveries included (none
    /// for auto-ack subscriptions).
    pub ack_latency_us: LatencyJson,
    /// Whether an operator paused its deliveries (`ferrymq subscription pause`).
    pub paused: bool,
}

/// A latency histogram summed over the topic's partitions since the broker started, in
/// microseconds. Each figure is the top of the bucket it falls in (buckets are at most 12.5 %
/// wide), so `p99: 130` means 99 % took at most 130 µs. The figures are `null` while `count` is 0;
/// `/metrics` has the buckets themselves.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct LatencyJson {
    pub count: u64,
    pub mean: Option<u64>,
    pub p50: Option<u64>,
    pub p90: Option<u64>,
    pub p99: Option<u64>,
    pub p999: Option<u64>,
    pub max: Option<u64>,
}

impl From<&ferrymq_protocol::Latency> for LatencyJson {
    fn from(h: &ferrymq_protocol::Latency) -> Self {
        let s = h.summary();
        LatencyJson {
            count: s.count,
            mean: s.mean,
            p50: s.p50,
            p90: s.p90,
            p99: s.p99,
            p999: s.p999,
            max: s.max,
        }
    }
}

/// Statistics of one topic and its subscriptions.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct TopicStatsJson {
    pub name: String,
    pub messages_in: u64,
    pub bytes_in: u64,
    pub messages_out: u64,
    pub bytes_out: u64,
    /// Messages retained (queue size).
    pub depth: u64,
    pub depth_bytes: u64,
    /// Messages discarded before every subscription had them: every message the drop-oldest
    /// policy discarded (whether or not the topic had subscriptions), and those a disk topic's
    /// retention removed before a subscription received them. Each message counts once.
    pub dropped: u64,
    pub publishers: u32,
    pub subscribers: u32,
    pub subscriptions: Vec<SubscriptionStatsJson>,
}

impl From<SubscriptionStats> for SubscriptionStatsJson {
    fn from(s: SubscriptionStats) -> Self {
        SubscriptionStatsJson {
            name: s.name,
            ephemeral: s.ephemeral,
            consumers: s.consumers,
            messages_out: s.messages_out,
            bytes_out: s.bytes_out,
            backlog: s.backlog,
            in_flight: s.in_flight,
            acked: s.acked,
            redelivered: s.redelivered,
            gave_up: s.gave_up,
            deliver_latency_us: (&s.deliver_latency).into(),
            ack_latency_us: (&s.ack_latency).into(),
            paused: s.paused,
        }
    }
}

impl From<TopicStats> for TopicStatsJson {
    fn from(t: TopicStats) -> Self {
        TopicStatsJson {
            name: t.name,
            messages_in: t.messages_in,
            bytes_in: t.bytes_in,
            messages_out: t.messages_out,
            bytes_out: t.bytes_out,
            depth: t.depth,
            depth_bytes: t.depth_bytes,
            dropped: t.dropped,
            publishers: t.publishers,
            subscribers: t.subscribers,
            subscriptions: t.subscriptions.into_iter().map(Into::into).collect(),
        }
    }
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct StatsList {
    pub topics: Vec<TopicStatsJson>,
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// The field names, sorted: serde_json's map order depends on its features.
    fn keys(value: &Value) -> Vec<&str> {
        let mut keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        keys
    }

    #[test]
    fn the_stats_document_keeps_its_field_names() {
        let topic = TopicStats {
            name: "orders".into(),
            messages_in: 5,
            subscriptions: vec![SubscriptionStats {
                name: "billing".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let list = StatsList {
            topics: vec![topic.into()],
        };
        let doc = serde_json::to_value(&list).unwrap();
        let topic = &doc["topics"][0];
        assert_eq!(
            keys(topic),
            [
                "bytes_in",
                "bytes_out",
                "depth",
                "depth_bytes",
                "dropped",
                "messages_in",
                "messages_out",
                "name",
                "publishers",
                "subscribers",
                "subscriptions"
            ]
        );
        assert_eq!(topic["messages_in"], 5);
        let subscription = &topic["subscriptions"][0];
        assert_eq!(subscription["name"], "billing");
        assert_eq!(subscription["paused"], false);
        assert_eq!(
            keys(&subscription["deliver_latency_us"]),
            ["count", "max", "mean", "p50", "p90", "p99", "p999"]
        );
        // No sample yet: the figures are null rather than a made-up zero.
        assert_eq!(subscription["ack_latency_us"]["count"], 0);
        assert_eq!(subscription["ack_latency_us"]["p99"], Value::Null);
    }
}
