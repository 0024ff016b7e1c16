//! What a health check reports: every fault that makes the broker refuse work or hide data, each
//! with where it is and what an operator does about it. `GET /status` is this list; the broker
//! is `ok` only while it is empty.

use std::path::PathBuf;

/// What kind of fault, as named in `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A partition's log failed a write or a sync (a full disk, a read-only file system); it is
    /// reopened by itself.
    PartitionWrites,
    /// A partition was found damaged at start and is out of service.
    PartitionDamaged,
    /// The metadata store (topics, subscriptions, acks) cannot commit; it is reopened by itself.
    MetadataStore,
    /// A read found damaged bytes in a partition's log: the messages there cannot be delivered
    /// until an operator skips them.
    UnreadableRange,
    /// The data directory is gone or unreadable under the running broker.
    DataDir,
}

impl FaultKind {
    pub const ALL: [FaultKind; 5] = [
        FaultKind::PartitionWrites,
        FaultKind::PartitionDamaged,
        FaultKind::MetadataStore,
        FaultKind::UnreadableRange,
        FaultKind::DataDir,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::PartitionWrites => "partition_writes",
            FaultKind::PartitionDamaged => "partition_damaged",
            FaultKind::MetadataStore => "metadata_store",
            FaultKind::UnreadableRange => "unreadable_range",
            FaultKind::DataDir => "data_dir",
        }
    }
}

/// One fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub topic: Option<String>,
    pub partition: Option<u32>,
    /// The file the fault is in, when it is in one.
    pub file: Option<PathBuf>,
    /// The byte position in `file`.
    pub position: Option<u64>,
    /// The offsets the fault makes unreadable (`[first, end)`), for an unreadable range.
    pub offsets: Option<(u64, u64)>,
    pub reason: String,
    /// What to do, in a sentence an operator can act on.
    pub action: String,
}

impl Fault {
    pub(crate) fn broker_wide(kind: FaultKind, reason: String, action: String) -> Fault {
        Fault {
            kind,
            topic: None,
            partition: None,
            file: None,
            position: None,
            offsets: None,
            reason,
            action,
        }
    }
}
