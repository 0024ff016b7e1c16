//! A topic's settings and contents as JSON: `GET /topics`, `GET /topics/{topic}`.

use ferrymq_protocol::{OverflowPolicy, Storage, TopicInfo};
use serde::Serialize;

/// `memory` or `disk` (`default` only in a request that leaves it to the server): the name a
/// topic's storage has in every JSON document and in the CLI.
pub fn storage_name(storage: Storage) -> &'static str {
    match storage {
        Storage::Memory => "memory",
        Storage::Disk => "disk",
        Storage::Default => "default",
    }
}

/// `drop-oldest` or `reject` (`default` only in a request that leaves it to the server).
pub fn overflow_name(overflow: OverflowPolicy) -> &'static str {
    match overflow {
        OverflowPolicy::DropOldest => "drop-oldest",
        OverflowPolicy::Reject => "reject",
        OverflowPolicy::Default => "default",
    }
}

/// A topic's settings and what it holds.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct TopicJson {
    pub name: String,
    pub partitions: u32,
    /// `disk` or `memory`.
    pub storage: &'static str,
    /// `drop-oldest` or `reject`.
    pub overflow: &'static str,
    /// Most messages retained; `null`: no limit.
    pub max_messages: Option<u64>,
    /// Most bytes retained; `null`: no limit.
    pub max_bytes: Option<u64>,
    /// Disk topics: `always`, `interval:<ms>` or `never`; `null` for memory topics, which have no
    /// log to sync.
    pub fsync: Option<String>,
    /// Disk topics: the age limit in ms, `null` for none; `null` for memory topics, which keep
    /// messages until their limits drop them.
    pub retention_ms: Option<u64>,
    /// `stream` (settled messages stay until the limits) or `work_queue` (they go once every
    /// subscription settled them).
    pub retention_policy: String,
    /// How long deduplication ids are remembered.
    pub dedup_window_ms: u64,
    /// Messages retained now, across partitions.
    pub messages: u64,
    pub bytes: u64,
    pub subscriptions: Vec<String>,
}

/// A limit as JSON: the broker's "none" (`u64::MAX`) is `null`, since a number that large is
/// not exact in JavaScript and would not survive a round trip through a browser or Node.
fn limit(value: u64) -> Option<u64> {
    (value != u64::MAX).then_some(value)
}

impl From<TopicInfo> for TopicJson {
    fn from(info: TopicInfo) -> Self {
        let disk = info.config.storage == Storage::Disk;
        TopicJson {
            name: info.name,
            partitions: info.config.partitions,
            storage: storage_name(info.config.storage),
            overflow: overflow_name(info.config.overflow),
            max_messages: limit(info.config.max_messages),
            max_bytes: limit(info.config.max_bytes),
            fsync: disk.then(|| info.config.fsync.to_string()),
            retention_ms: limit(info.config.retention_ms).filter(|_| disk),
            retention_policy: info.config.retention_policy.to_string(),
            dedup_window_ms: info.config.dedup_window_ms,
            messages: info.messages,
            bytes: info.bytes,
            subscriptions: info.subscriptions,
        }
    }
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct TopicList {
    pub topics: Vec<TopicJson>,
}

#[cfg(test)]
mod tests {
    use ferrymq_protocol::{FsyncPolicy, RetentionPolicy, TopicConfig};
    use serde_json::Value;

    use super::*;

    fn info(storage: Storage) -> TopicInfo {
        TopicInfo {
            name: "orders".into(),
            config: TopicConfig {
                partitions: 2,
                storage,
                overflow: OverflowPolicy::Reject,
                max_messages: u64::MAX,
                max_bytes: 1024,
                fsync: FsyncPolicy::Always,
                retention_ms: u64::MAX,
                retention_policy: RetentionPolicy::Stream,
                dedup_window_ms: 120_000,
                replicas: 0,
            },
            messages: 3,
            bytes: 30,
            subscriptions: vec!["billing".into()],
        }
    }

    #[test]
    fn unbounded_limits_are_null_and_memory_topics_have_no_log_settings() {
        let disk = serde_json::to_value(TopicJson::from(info(Storage::Disk))).unwrap();
        assert_eq!(disk["storage"], "disk");
        assert_eq!(disk["overflow"], "reject");
        assert_eq!(disk["max_messages"], Value::Null);
        assert_eq!(disk["max_bytes"], 1024);
        assert_eq!(disk["fsync"], "always");
        assert_eq!(disk["retention_ms"], Value::Null);
        assert_eq!(disk["subscriptions"][0], "billing");

        let memory = serde_json::to_value(TopicJson::from(info(Storage::Memory))).unwrap();
        assert_eq!(memory["storage"], "memory");
        assert_eq!(memory["fsync"], Value::Null);
        assert_eq!(memory["retention_ms"], Value::Null);
    }
}
