//! A topic's settings (in CREATE_TOPIC and TOPIC_INFO) and what TOPIC_INFO describes, with
//! their encodings.

use bytes::{BufMut, BytesMut};

use crate::error::ProtocolError;
use crate::limits::{PROTOCOL_VERSION_2, PROTOCOL_VERSION_3};
use crate::wire::{put_str16, Reader};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Storage {
    Memory = 0,
    Disk = 1,
    /// The server's default (`--default-storage`: disk when it has a data dir). Version 2 on;
    /// in version 1 a client that says nothing says memory.
    #[default]
    Default = 2,
}

/// What a bounded topic does when a publish would exceed its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum OverflowPolicy {
    /// Discard the oldest retained messages to make room (RabbitMQ's default `drop-head`).
    DropOldest = 0,
    /// Refuse the publish with `TopicFull`.
    Reject = 1,
    /// The server's default (`--default-overflow`). Version 2 on; in version 1 a client that
    /// says nothing says drop-oldest.
    #[default]
    Default = 2,
}

/// When a disk topic's log is synced, and so what a publish acknowledgement promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FsyncPolicy {
    /// The server's default (`always` unless configured otherwise).
    #[default]
    Default,
    /// Every publish is acknowledged after an fsync that covers it; concurrent publishes share
    /// one fsync (group commit).
    Always,
    /// The log is synced at least every this many milliseconds; publishes are acknowledged once
    /// written.
    IntervalMs(u32),
    /// Never synced by the broker (the operating system writes back when it likes); publishes are
    /// acknowledged once written.
    Never,
}

impl std::fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsyncPolicy::Default => f.write_str("default"),
            FsyncPolicy::Always => f.write_str("always"),
            FsyncPolicy::IntervalMs(ms) => write!(f, "interval:{ms}"),
            FsyncPolicy::Never => f.write_str("never"),
        }
    }
}

impl std::str::FromStr for FsyncPolicy {
    type Err = String;

    /// `always`, `never`, `default` or `interval:<ms>` (1 ms or more).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "always" => Ok(FsyncPolicy::Always),
            "never" => Ok(FsyncPolicy::Never),
            "default" => Ok(FsyncPolicy::Default),
            _ => match s.strip_prefix("interval:").map(str::parse::<u32>) {
                Some(Ok(ms)) if ms > 0 => Ok(FsyncPolicy::IntervalMs(ms)),
                _ => Err(format!(
                    "'{s}' is not an fsync policy: use always, never or interval:<ms> (ms >= 1)"
                )),
            },
        }
    }
}

/// Whether a topic keeps the messages every subscription settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum RetentionPolicy {
    /// The server's default: `Stream` for disk topics, `WorkQueue` for memory topics.
    #[default]
    Default = 0,
    /// Keep messages until the age, size and count limits let them go, acked or not, so that a
    /// subscription created later with `earliest` reads them (Kafka's log, JetStream's `limits`).
    Stream = 1,
    /// Delete messages once every subscription settled them (JetStream's `workqueue`).
    WorkQueue = 2,
}

impl std::fmt::Display for RetentionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RetentionPolicy::Default => "default",
            RetentionPolicy::Stream => "stream",
            RetentionPolicy::WorkQueue => "work_queue",
        })
    }
}

impl std::str::FromStr for RetentionPolicy {
    type Err = String;

    /// `stream`, `work_queue` (or `work-queue`), `default`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stream" => Ok(RetentionPolicy::Stream),
            "work_queue" | "work-queue" => Ok(RetentionPolicy::WorkQueue),
            "default" => Ok(RetentionPolicy::Default),
            _ => Err(format!(
                "'{s}' is not a retention policy: use stream or work_queue"
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConfig {
    /// 0 = the server's default.
    pub partitions: u32,
    pub storage: Storage,
    pub overflow: OverflowPolicy,
    /// 0 = the server's default.
    pub max_messages: u64,
    /// 0 = the server's default.
    pub max_bytes: u64,
    /// Disk topics: when the log is synced. Ignored by memory topics.
    pub fsync: FsyncPolicy,
    /// Disk topics: messages older than this many milliseconds are deleted (whole segments at a
    /// time). 0 = the server's default; `u64::MAX` = no age limit.
    pub retention_ms: u64,
    /// Whether settled messages go at once (work queue) or stay until the limits (stream).
    pub retention_policy: RetentionPolicy,
    /// How long the topic remembers deduplication ids; 0 = the server's default.
    pub dedup_window_ms: u64,
    /// On how many nodes of a cluster the topic's partitions are replicated: 1, 3 or 5; 0 = the
    /// server's default (1 on a single node, 3 in a cluster of three or more). Version 3 on.
    pub replicas: u8,
}

impl Default for TopicConfig {
    fn default() -> Self {
        TopicConfig {
            partitions: 0,
            storage: Storage::Default,
            overflow: OverflowPolicy::Default,
            max_messages: 0,
            max_bytes: 0,
            fsync: FsyncPolicy::Default,
            retention_ms: 0,
            retention_policy: RetentionPolicy::Default,
            dedup_window_ms: 0,
            replicas: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    pub config: TopicConfig,
    /// Messages currently retained across partitions.
    pub messages: u64,
    pub bytes: u64,
    pub subscriptions: Vec<String>,
}

/// Writes the config in the layout of `version`: version 1 ends after `retention_ms` and has no
/// `default` storage or overflow (written as version 1 read an unset field: memory, drop-oldest);
/// version 2 ends after `dedup_window_ms` (no `replicas`: the server's default).
pub(super) fn encode_topic_config(c: &TopicConfig, version: u16, buf: &mut BytesMut) {
    let v2 = version >= PROTOCOL_VERSION_2;
    buf.put_u32_le(c.partitions);
    buf.put_u8(match c.storage {
        Storage::Default if !v2 => Storage::Memory as u8,
        storage => storage as u8,
    });
    buf.put_u8(match c.overflow {
        OverflowPolicy::Default if !v2 => OverflowPolicy::DropOldest as u8,
        overflow => overflow as u8,
    });
    buf.put_u64_le(c.max_messages);
    buf.put_u64_le(c.max_bytes);
    let (kind, interval_ms) = match c.fsync {
        FsyncPolicy::Default => (0, 0),
        FsyncPolicy::Always => (1, 0),
        FsyncPolicy::IntervalMs(ms) => (2, ms),
        FsyncPolicy::Never => (3, 0),
    };
    buf.put_u8(kind);
    buf.put_u32_le(interval_ms);
    buf.put_u64_le(c.retention_ms);
    if v2 {
        buf.put_u8(c.retention_policy as u8);
        buf.put_u64_le(c.dedup_window_ms);
    }
    if version >= PROTOCOL_VERSION_3 {
        buf.put_u8(c.replicas);
    }
}

// Over 70 lines on purpose: it reads the fields once, in wire order, each check beside the
// field it guards (as `RecordSpan::parse` does); split, the wire order would be spread thin.
/// Reads a config in the layout of `version`; the fields a version lacks are the server's
/// defaults.
pub(super) fn decode_topic_config(
    r: &mut Reader,
    version: u16,
) -> Result<TopicConfig, ProtocolError> {
    let v2 = version >= PROTOCOL_VERSION_2;
    let partitions = r.u32("topic.partitions")?;
    let storage = match r.u8("topic.storage")? {
        0 => Storage::Memory,
        1 => Storage::Disk,
        2 if v2 => Storage::Default,
        s => {
            return Err(ProtocolError::invalid(
                "topic.storage",
                format!("unknown storage {s} in protocol version {version}"),
            ))
        }
    };
    let overflow = match r.u8("topic.overflow")? {
        0 => OverflowPolicy::DropOldest,
        1 => OverflowPolicy::Reject,
        2 if v2 => OverflowPolicy::Default,
        o => {
            return Err(ProtocolError::invalid(
                "topic.overflow",
                format!("unknown policy {o} in protocol version {version}"),
            ))
        }
    };
    let max_messages = r.u64("topic.max_messages")?;
    let max_bytes = r.u64("topic.max_bytes")?;
    let kind = r.u8("topic.fsync")?;
    let interval_ms = r.u32("topic.fsync_interval_ms")?;
    let fsync = match (kind, interval_ms) {
        (0, 0) => FsyncPolicy::Default,
        (1, 0) => FsyncPolicy::Always,
        (2, ms) if ms > 0 => FsyncPolicy::IntervalMs(ms),
        (3, 0) => FsyncPolicy::Never,
        (2, _) => {
            return Err(ProtocolError::invalid(
                "topic.fsync_interval_ms",
                "must be at least 1 for the interval policy",
            ))
        }
        (0..=3, ms) => {
            return Err(ProtocolError::invalid(
                "topic.fsync_interval_ms",
                format!("{ms} given for a policy without an interval: must be 0"),
            ))
        }
        (k, _) => {
            return Err(ProtocolError::invalid(
                "topic.fsync",
                format!("unknown fsync policy {k}"),
            ))
        }
    };
    Ok(TopicConfig {
        partitions,
        storage,
        overflow,
        max_messages,
        max_bytes,
        fsync,
        retention_ms: r.u64("topic.retention_ms")?,
        retention_policy: match if v2 {
            r.u8("topic.retention_policy")?
        } else {
            0
        } {
            0 => RetentionPolicy::Default,
            1 => RetentionPolicy::Stream,
            2 => RetentionPolicy::WorkQueue,
            p => {
                return Err(ProtocolError::invalid(
                    "topic.retention_policy",
                    format!("unknown retention policy {p}"),
                ))
            }
        },
        dedup_window_ms: if v2 {
            r.u64("topic.dedup_window_ms")?
        } else {
            0
        },
        replicas: if version >= PROTOCOL_VERSION_3 {
            r.u8("topic.replicas")?
        } else {
            0
        },
    })
}

pub(super) fn encode_topic_info(t: &TopicInfo, version: u16, buf: &mut BytesMut) {
    put_str16(buf, &t.name);
    encode_topic_config(&t.config, version, buf);
    buf.put_u64_le(t.messages);
    buf.put_u64_le(t.bytes);
    buf.put_u32_le(t.subscriptions.len() as u32);
    for s in &t.subscriptions {
        put_str16(buf, s);
    }
}

pub(super) fn decode_topic_info(r: &mut Reader, version: u16) -> Result<TopicInfo, ProtocolError> {
    let name = r.str16("topic_info.name")?;
    let config = decode_topic_config(r, version)?;
    let messages = r.u64("topic_info.messages")?;
    let bytes = r.u64("topic_info.bytes")?;
    let count = r.u32("topic_info.subscription_count")?;
    let mut subscriptions = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        subscriptions.push(r.str16("topic_info.subscription")?);
    }
    Ok(TopicInfo {
        name,
        config,
        messages,
        bytes,
        subscriptions,
    })
}
