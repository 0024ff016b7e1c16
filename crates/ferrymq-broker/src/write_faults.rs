//! The log lines of partitions that refuse writes. A full disk fails every write and every
//! sync, and a reopened log fails again at the next one: logging each failure wrote dozens of
//! lines a second, onto what may be the full disk. Instead each partition logs one line when it
//! stops and one when it takes writes again; the failures in between are counted, and while
//! they go on a summary of the partitions still refusing writes is logged at most once per
//! [`SUMMARY_INTERVAL`].

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use parking_lot::Mutex;

use crate::throttle::LogThrottle;

/// Least time between two summaries of the partitions still refusing writes.
pub(crate) const SUMMARY_INTERVAL: Duration = Duration::from_secs(60);

/// The partitions that refuse writes, by directory, with the last reason.
pub(crate) struct WriteFaults {
    refusing: Mutex<BTreeMap<String, String>>,
    summary: LogThrottle,
}

impl Default for WriteFaults {
    fn default() -> Self {
        WriteFaults {
            refusing: Mutex::new(BTreeMap::new()),
            summary: LogThrottle::new(SUMMARY_INTERVAL),
        }
    }
}

impl WriteFaults {
    /// A partition stopped taking writes: logged once, until it recovers.
    pub fn stopped(&self, dir: &Path, reason: &str) {
        tracing::error!(dir = %dir.display(), %reason, "partition log stopped; writes are refused until it recovers");
        let mut refusing = self.refusing.lock();
        if refusing.is_empty() {
            // The stop line says it all: the first summary comes an interval later.
            let _ = self.summary.allow();
        }
        refusing.insert(dir.display().to_string(), reason.to_string());
    }

    /// A partition that refuses writes failed again: counted, and summed up with the others
    /// once per interval.
    pub fn again(&self, dir: &Path, reason: &str) {
        tracing::debug!(dir = %dir.display(), %reason, "partition log still refuses writes");
        let mut refusing = self.refusing.lock();
        refusing.insert(dir.display().to_string(), reason.to_string());
        if let Some(failures) = self.summary.allow() {
            let list: Vec<String> = refusing
                .iter()
                .map(|(dir, reason)| format!("{dir} ({reason})"))
                .collect();
            tracing::warn!(
                partitions = refusing.len(),
                failures = failures + 1,
                "{} partitions still refuse writes: {}",
                refusing.len(),
                list.join(", ")
            );
        }
    }

    /// A partition that refused writes took one again.
    pub fn recovered(&self, dir: &Path) {
        tracing::info!(dir = %dir.display(), "partition log recovered; writes are accepted again");
        self.refusing.lock().remove(&dir.display().to_string());
    }

    /// A partition that refused writes is gone (its topic was deleted): no line of its own.
    pub fn forget(&self, dir: &Path) {
        self.refusing.lock().remove(&dir.display().to_string());
    }
}
