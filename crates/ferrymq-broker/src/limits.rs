//! The process's open-files limit, and the share of it the partition logs keep open.
//!
//! A disk partition has three files per segment, so a broker with thousands of disk topics has
//! far more files than a common limit of 1024 descriptors. The partition logs therefore share one
//! bounded set of open handles (`FileHandles`), sized here from the limit in force after the
//! soft limit was raised to the hard one; the rest of the limit stays free for connections.

use std::io;
use std::sync::OnceLock;

/// Most files the partition logs keep open between them, however high the limit: the three
/// files of ~1 300 busy partitions; past it handles are closed and reopened on demand. Leaves
/// room for 10 000 connections under a 20 000-descriptor limit.
pub const LOG_FILES_MAX: usize = 4096;

/// Fewest files the partition logs keep open, however low the limit: a few partitions' three,
/// so that a write does not have to reopen the file the previous one just closed.
const LOG_FILES_MIN: usize = 16;

/// The soft limit asked for when the hard limit is unlimited and `fs.nr_open` cannot be read:
/// Linux refuses more than `fs.nr_open`, whose default this is.
const NR_OPEN_DEFAULT: u64 = 1 << 20;

/// The open-files limit after [`raise_open_files_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFilesLimit {
    /// The soft limit in force: how many descriptors the process may hold.
    pub soft: u64,
    /// The soft limit before the raise; `None` if it was not raised.
    pub raised_from: Option<u64>,
}

fn get_open_files_limit() -> io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes into `limit`, a plain C struct that outlives the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(limit)
}

/// The soft open-files limit in force now; `None` when unlimited or unreadable.
pub fn open_files_limit() -> Option<u64> {
    let soft = as_count(get_open_files_limit().ok()?.rlim_cur);
    (soft != u64::MAX).then_some(soft)
}

/// Counts as `u64` (`rlim_t` on Linux), unlimited as `u64::MAX`.
fn as_count(value: libc::rlim_t) -> u64 {
    if value == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        value
    }
}

/// Raises the soft open-files limit to the hard limit. The soft limit is only a default that any
/// process may raise up to the hard one: it stays at 1024 for programs that use `select(2)`,
/// which FerryMQ does not, while the hard limit is often far higher (systemd gives services
/// 1024 soft and 524 288 hard, for programs to raise; Go's runtime raises it at start). So a
/// user need not change `ulimit -n` to have thousands of topics. An unlimited hard limit is
/// taken as `fs.nr_open`, the most Linux accepts.
pub fn raise_open_files_limit() -> io::Result<OpenFilesLimit> {
    let limit = get_open_files_limit()?;
    let soft = as_count(limit.rlim_cur);
    let hard = match as_count(limit.rlim_max) {
        u64::MAX => std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(NR_OPEN_DEFAULT),
        hard => hard,
    };
    if soft >= hard {
        return Ok(OpenFilesLimit {
            soft,
            raised_from: None,
        });
    }
    let raised = libc::rlimit {
        rlim_cur: hard,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit only reads `raised`, a plain C struct that outlives the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OpenFilesLimit {
        soft: hard,
        raised_from: Some(soft),
    })
}

/// The share of an open-files limit the partition logs keep open: half, within
/// [`LOG_FILES_MIN`]..=[`LOG_FILES_MAX`]. The other half is for everything else the broker
/// holds: a descriptor per connection (binary protocol and HTTP), the metadata store, the
/// listeners, the runtime's own, and the handles a sync job holds past the bound until it ends
/// (three per sync thread). Under 1024 that is 512 log files and room for ~500 connections.
pub fn log_files_max(open_files: u64) -> usize {
    let half = usize::try_from(open_files / 2).unwrap_or(usize::MAX);
    half.clamp(LOG_FILES_MIN, LOG_FILES_MAX)
}

/// The partition logs' share of this process's limit, raised once per process (the brokers a
/// process opens share the limit), and said in the log.
pub(crate) fn log_files_max_for_process() -> usize {
    static LOG_FILES: OnceLock<usize> = OnceLock::new();
    *LOG_FILES.get_or_init(|| {
        let limit = match raise_open_files_limit() {
            Ok(limit) => limit,
            Err(error) => {
                let soft = get_open_files_limit().map_or(0, |limit| as_count(limit.rlim_cur));
                tracing::warn!(%error, open_files = soft, "cannot raise the open-files limit to its hard limit");
                OpenFilesLimit {
                    soft,
                    raised_from: None,
                }
            }
        };
        let max = log_files_max(limit.soft);
        match limit.raised_from {
            Some(from) => tracing::info!(
                open_files = limit.soft,
                raised_from = from,
                log_files_max = max,
                "raised the open-files limit to the hard limit; partition logs keep at most log_files_max files open at once"
            ),
            None => tracing::info!(
                open_files = limit.soft,
                log_files_max = max,
                "partition logs keep at most log_files_max files open at once"
            ),
        }
        max
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_logs_take_half_the_limit_within_bounds() {
        assert_eq!(log_files_max(1024), 512);
        assert_eq!(log_files_max(20_000), LOG_FILES_MAX);
        assert_eq!(log_files_max(u64::MAX), LOG_FILES_MAX);
        assert_eq!(log_files_max(8), LOG_FILES_MIN);
        assert_eq!(log_files_max(0), LOG_FILES_MIN);
    }

    #[test]
    fn raising_leaves_the_soft_limit_at_the_hard_one() {
        let limit = raise_open_files_limit().unwrap();
        let now = get_open_files_limit().unwrap();
        assert_eq!(as_count(now.rlim_cur), limit.soft);
        assert!(limit.soft > 0);
        // Raising again changes nothing.
        assert_eq!(raise_open_files_limit().unwrap().raised_from, None);
    }
}
