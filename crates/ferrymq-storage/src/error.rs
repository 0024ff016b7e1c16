use std::io;
use std::path::PathBuf;

/// What can go wrong with a partition log. I/O errors name their file in their message.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// Bytes that are not a valid entry where one must be: bit rot, a bad disk, or a file edited
    /// by hand. Never served; the operator decides (restore the file, or delete segments).
    #[error("corrupt log {}: at byte {position}: {reason}; the damaged data is not served, restore the file or delete the segment", file.display())]
    Corrupt {
        file: PathBuf,
        position: u64,
        reason: String,
    },
    /// A segment in the middle of the sequence is gone: offsets would have a hole.
    #[error("segment missing in {}: entries {expected_base_offset}..{found_base_offset} should be in a segment before {}; restore it or delete the older segments", dir.display(), found.display())]
    MissingSegment {
        dir: PathBuf,
        expected_base_offset: u64,
        found_base_offset: u64,
        found: PathBuf,
    },
    #[error("offset {offset} is outside the log, which holds {start_offset}..{next_offset}")]
    OffsetOutOfRange {
        offset: u64,
        start_offset: u64,
        next_offset: u64,
    },
    #[error("record of {bytes} bytes is larger than the log's limit of {max} bytes")]
    RecordTooLarge { bytes: usize, max: usize },
    #[error("batch of {bytes} bytes is larger than the log's limit of {max} bytes; publish it in smaller batches")]
    BatchTooLarge { bytes: u64, max: u64 },
    #[error("invalid log configuration: {0}")]
    Config(String),
    /// An earlier write failed and could not be undone (the file may hold a partial entry, and
    /// appending after it would bury it mid-segment), or a sync failed (what it covered may not be
    /// on disk, and a retried sync could not tell). Reopening the log recovers from what is there.
    #[error("log {} refuses writes after a failed write or sync ({reason}); reopen it to recover", dir.display())]
    Failed { dir: PathBuf, reason: String },
}

impl LogError {
    /// True if the process or the system ran out of file descriptors: the log is not damaged,
    /// and opening it again succeeds once descriptors free up.
    pub fn is_out_of_open_files(&self) -> bool {
        matches!(self, LogError::Io(error) if crate::storage::is_out_of_open_files(error))
    }
}
