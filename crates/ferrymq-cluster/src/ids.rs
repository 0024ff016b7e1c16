//! Identifiers of nodes and Raft groups.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A broker node of the cluster.
pub type NodeId = u64;

/// A Raft group. Group 0 is the cluster metadata; every partition is a group of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupId(pub u64);

impl GroupId {
    /// The cluster metadata group.
    pub const METADATA: GroupId = GroupId(0);

    /// Whether this is the metadata group.
    pub fn is_metadata(self) -> bool {
        self == Self::METADATA
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{}", self.0)
    }
}
