//! What a publish acknowledgement (PUBLISHED) promises.

/// What a publish acknowledgement promises about the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Durability {
    /// Held in memory only (a memory topic).
    #[default]
    Memory = 0,
    /// Written to the log, not yet synced (`fsync=never`).
    Written = 1,
    /// Written and synced within the topic's interval (`fsync=interval`).
    SyncedInterval = 2,
    /// Written and fsynced before this ack (`fsync=always`).
    Synced = 3,
}
