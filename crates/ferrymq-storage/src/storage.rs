//! The storage seam: the few file operations the log needs, behind one trait.
//!
//! Invariants every implementation keeps:
//! - Files are addressed by path; there are no handles to leak or to outlive a removal.
//! - `append` only ever adds bytes at the end. `write_at` writes where the caller says the
//!   file's entries end, which is the file's end unless the storage kept room past it: zeros
//!   written ahead (see [`LogStorage::write_later`]), which a reopened file shows as a zero tail.
//!   Nothing is ever overwritten but those zeros.
//! - Bytes are durable only after `sync` of that file returned `Ok`, and a newly created file's
//!   name is durable only after `sync_dir` of its directory returned `Ok`.
//! - `sync_later` / `sync_dir_later` split a sync in two for group commit: the call captures
//!   what to sync (cheap, under the caller's lock), the returned [`SyncFn`] does the slow part on
//!   any thread without the storage. When it returns `Ok`, every byte written to the file before
//!   `sync_later` was called (every name created in the directory before `sync_dir_later`) is
//!   durable, exactly as if `sync` / `sync_dir` had been called at that moment.
//! - Every error is an `std::io::Error` whose message names the operation and the path, so that
//!   an operator reading a log line knows which file to look at.
//!
//! [`FileStorage`] is the real thing (std::fs, `sync_data`). [`MemoryStorage`] keeps written but
//! unsynced bytes apart from synced ones so that [`MemoryStorage::crash`] can simulate a power
//! loss deterministically from a seed; the seeded simulation tests are built on it.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

/// The deferred half of a sync: run it on any thread, without the storage. See
/// [`LogStorage::sync_later`].
pub type SyncFn = Box<dyn FnOnce() -> io::Result<()> + Send>;

/// The deferred half of an append: writes `chunks`, in order, at the end of the file, then makes
/// the file durable if `sync` is set (every byte it holds then, as [`LogStorage::sync`]). On a
/// failed write the file is cut back to its length before the call where that is possible. See
/// [`LogStorage::append_later`].
pub type AppendFn = Box<dyn FnOnce(&[Bytes], bool) -> io::Result<()> + Send>;

/// The deferred half of a positioned write: writes `chunks`, in order, from the position given,
/// keeps the room asked for past them, then makes the file durable if `sync` is set. On a failed
/// write the file is cut back to that position where possible. See [`LogStorage::write_later`].
pub type WriteFn = Box<dyn FnOnce(&[Bytes], u64, bool) -> io::Result<()> + Send>;

/// The file operations the partition log needs, and nothing more. Object safe:
/// `Box<dyn LogStorage + Send>` is a `LogStorage` too.
pub trait LogStorage {
    /// Creates `dir` and its parents if missing.
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()>;
    /// Names (not paths) of the regular files directly in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates a new empty file; fails with `AlreadyExists` if it exists.
    fn create(&mut self, path: &Path) -> io::Result<()>;
    /// Current length of the file, synced or not.
    fn len(&self, path: &Path) -> io::Result<u64>;
    /// Appends `bytes` at the end of the file.
    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Fills `buf` from `position`; fails with `UnexpectedEof` if the file is shorter.
    fn read_at(&self, path: &Path, position: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Makes the file's bytes durable.
    fn sync(&mut self, path: &Path) -> io::Result<()>;
    /// Makes the names of the files created in `dir` durable.
    fn sync_dir(&mut self, dir: &Path) -> io::Result<()>;
    /// Cuts the file to `len` bytes.
    fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()>;
    /// Removes the file.
    fn remove(&mut self, path: &Path) -> io::Result<()>;

    /// Captures a sync of the file to be run later: when the returned closure returns `Ok`, at
    /// least every byte written to the file before this call is durable. The closure needs no
    /// access to the storage, so it can run on another thread while writes go on; writes made
    /// after this call may or may not be covered. An error here (the file is gone) or from the
    /// closure (the sync failed) means nothing is known to be durable.
    ///
    /// The default syncs at once and returns a closure that does nothing: correct, but it does
    /// the slow part under the caller's lock. Implementations that can defer it should.
    fn sync_later(&mut self, path: &Path) -> io::Result<SyncFn> {
        self.sync(path)?;
        Ok(Box::new(|| Ok(())))
    }

    /// Captures a sync of the directory to be run later: when the returned closure returns `Ok`,
    /// at least the names of the files created in `dir` before this call are durable. Defaults
    /// to syncing at once, like [`LogStorage::sync_later`].
    fn sync_dir_later(&mut self, dir: &Path) -> io::Result<SyncFn> {
        self.sync_dir(dir)?;
        Ok(Box::new(|| Ok(())))
    }

    /// Whether the file exists. Any error other than "not found" counts as present, so the caller
    /// meets the real error on its next operation rather than recreating a file it cannot see.
    fn exists(&self, path: &Path) -> bool {
        match self.len(path) {
            Ok(_) => true,
            Err(e) => e.kind() != io::ErrorKind::NotFound,
        }
    }

    /// Captures appends to the file to be made later, on another thread and without the storage,
    /// so that the owner of a log need not hold its lock (or block an async worker) through a
    /// write that may wait for the disk. `None`: this storage cannot, and the caller writes with
    /// [`LogStorage::append`] instead (the default). An error: the file cannot be reached now.
    fn append_later(&mut self, path: &Path) -> Option<io::Result<AppendFn>> {
        let _ = path;
        None
    }

    /// Writes `bytes` at `position`, which the caller knows to be where the file's entries end:
    /// the file's end, or inside the room a [`LogStorage::write_later`] kept past it. The default
    /// appends, which is the same thing for a storage that keeps no room.
    fn write_at(&mut self, path: &Path, position: u64, bytes: &[u8]) -> io::Result<()> {
        let _ = position;
        self.append(path, bytes)
    }

    /// Like [`LogStorage::append_later`], but the closure writes at a position the caller gives
    /// (where the file's entries end), and keeps `room` bytes past what it wrote: when fewer are
    /// left, it writes zeros ahead, `room` bytes at a time. A sync after writes into that room
    /// does not change the file's size, so it need not write the file's metadata: on ext4 an
    /// fdatasync then costs one device write instead of two. The zeros stay on disk until the
    /// file is truncated; a reopened file shows them as a zero tail, which the log cuts off.
    /// The default keeps no room and appends.
    fn write_later(&mut self, path: &Path, room: u64) -> Option<io::Result<WriteFn>> {
        let _ = room;
        let append = match self.append_later(path)? {
            Ok(append) => append,
            Err(error) => return Some(Err(error)),
        };
        Some(Ok(Box::new(
            move |chunks: &[Bytes], _position: u64, sync: bool| append(chunks, sync),
        )))
    }
}

/// Wraps an I/O error with the operation and the path, keeping its kind. Running out of file
/// descriptors is said as such, with the limit and how to raise it: the files are fine, and an
/// operator reading "Too many open files" alone could not tell which limit to change.
pub(crate) fn io_error(error: io::Error, operation: &str, path: &Path) -> io::Error {
    if is_out_of_open_files(&error) {
        let limit = match open_files_limit() {
            Some(limit) => format!("the process's open-files limit is {limit}"),
            None => "the process's open-files limit is reached".to_string(),
        };
        let which = if error.raw_os_error() == Some(libc::ENFILE) {
            "the system's open-files table is full (raise fs.file-max)"
        } else {
            "raise the limit (`ulimit -n`, or LimitNOFILE= in the systemd unit)"
        };
        return io::Error::new(
            error.kind(),
            OutOfOpenFiles(format!(
                "{operation} {}: too many open files: {limit}; {which}",
                path.display()
            )),
        );
    }
    io::Error::new(
        error.kind(),
        format!("{operation} {}: {error}", path.display()),
    )
}

/// An I/O error caused by the process (EMFILE) or the system (ENFILE) having no file descriptor
/// left: nothing is wrong with the files, and the same operation succeeds once descriptors free
/// up. Kept inside the `io::Error` so that callers can tell it from damage.
#[derive(Debug)]
struct OutOfOpenFiles(String);

impl std::fmt::Display for OutOfOpenFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OutOfOpenFiles {}

/// True if `error` says the process or the system ran out of file descriptors (EMFILE, ENFILE),
/// raw or as wrapped by [`FileStorage`].
pub fn is_out_of_open_files(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
        || error
            .get_ref()
            .is_some_and(|inner| inner.is::<OutOfOpenFiles>())
}

/// The soft `RLIMIT_NOFILE` now in force; `None` if it cannot be read or is unlimited.
fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes into `limit`, a plain C struct that outlives the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(limit.rlim_cur)
}

/// A boxed storage (e.g. `Box<dyn LogStorage + Send>`, so that the broker can choose the backend at
/// run time) delegates every operation, overridden ones included.
impl<S: LogStorage + ?Sized> LogStorage for Box<S> {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        (**self).create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        (**self).list(dir)
    }
    fn create(&mut self, path: &Path) -> io::Result<()> {
        (**self).create(path)
    }
    fn len(&self, path: &Path) -> io::Result<u64> {
        (**self).len(path)
    }
    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        (**self).append(path, bytes)
    }
    fn read_at(&self, path: &Path, position: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_at(path, position, buf)
    }
    fn sync(&mut self, path: &Path) -> io::Result<()> {
        (**self).sync(path)
    }
    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        (**self).sync_dir(dir)
    }
    fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()> {
        (**self).truncate(path, len)
    }
    fn remove(&mut self, path: &Path) -> io::Result<()> {
        (**self).remove(path)
    }
    fn exists(&self, path: &Path) -> bool {
        (**self).exists(path)
    }
    fn sync_later(&mut self, path: &Path) -> io::Result<SyncFn> {
        (**self).sync_later(path)
    }
    fn sync_dir_later(&mut self, dir: &Path) -> io::Result<SyncFn> {
        (**self).sync_dir_later(dir)
    }
    fn append_later(&mut self, path: &Path) -> Option<io::Result<AppendFn>> {
        (**self).append_later(path)
    }
    fn write_at(&mut self, path: &Path, position: u64, bytes: &[u8]) -> io::Result<()> {
        (**self).write_at(path, position, bytes)
    }
    fn write_later(&mut self, path: &Path, room: u64) -> Option<io::Result<WriteFn>> {
        (**self).write_later(path, room)
    }
}

/// Most file handles a [`FileStorage`] of its own keeps open. A partition has three files per
/// segment; past this a handle is closed to make room and reopened on demand, so descriptors
/// stay bounded however many segments a partition keeps.
const OPEN_FILES_MAX: usize = 64;

/// Open file handles by path, bounded, and shareable: a broker gives all its partitions one
/// set, so that thousands of partitions hold at most `max` descriptors between them (each one
/// alone would hold three per partition, and 7 000 partitions would exhaust a 20 000-descriptor
/// limit). Past the bound, an arbitrary handle is closed; the next use of that file reopens it.
/// The active segment's handle is no exception: a sync job keeps the handles it captured until
/// it ends, so descriptors exceed `max` by at most the files of the jobs running (three each).
#[derive(Debug, Clone)]
pub struct FileHandles {
    inner: Arc<Mutex<HashMap<PathBuf, Arc<File>>>>,
    max: usize,
}

impl FileHandles {
    pub fn new(max: usize) -> Self {
        FileHandles {
            inner: Arc::new(Mutex::new(HashMap::new())),
            max: max.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<File>>> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn get(&self, path: &Path) -> Option<Arc<File>> {
        self.lock().get(path).cloned()
    }

    fn insert(&self, path: &Path, file: Arc<File>) {
        let mut handles = self.lock();
        if handles.len() >= self.max && !handles.contains_key(path) {
            if let Some(victim) = handles.keys().next().cloned() {
                handles.remove(&victim);
            }
        }
        handles.insert(path.to_path_buf(), file);
    }

    fn remove(&self, path: &Path) {
        self.lock().remove(path);
    }

    /// Closes every handle on a file under `dir` (by path, not following links), so that once
    /// `dir` is removed no descriptor keeps its files' blocks allocated. A handle in use by a
    /// sync running now closes when that sync ends.
    pub fn forget_under(&self, dir: &Path) {
        self.lock().retain(|path, _| !path.starts_with(dir));
    }

    /// Closes every handle not in use (a sync job holds its own until it ends): what is left to
    /// do when an open finds no descriptor free.
    fn close_all(&self) {
        self.lock().clear();
    }

    /// Handles open now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for FileHandles {
    fn default() -> Self {
        FileHandles::new(OPEN_FILES_MAX)
    }
}

/// Files on a real file system, through `std::fs`. Durability is `File::sync_data` (fdatasync).
#[derive(Debug, Default)]
pub struct FileStorage {
    /// Open handles by path: appends and positional reads reuse them instead of reopening.
    handles: FileHandles,
}

impl FileStorage {
    pub fn new() -> Self {
        Self::default()
    }

    /// A storage whose open handles are kept in `handles`, shared with other storages.
    pub fn with_handles(handles: FileHandles) -> Self {
        FileStorage { handles }
    }

    fn handle(&self, path: &Path, operation: &str) -> io::Result<Arc<File>> {
        if let Some(file) = self.handles.get(path) {
            return Ok(file);
        }
        // Not O_APPEND: writes give their position (Linux's pwrite ignores it under O_APPEND).
        let file = self
            .open_freeing_handles(|| OpenOptions::new().read(true).write(true).open(path))
            .map_err(|e| io_error(e, operation, path))?;
        let file = Arc::new(file);
        self.handles.insert(path, Arc::clone(&file));
        Ok(file)
    }

    /// See [`open_freeing`].
    fn open_freeing_handles(&self, open: impl Fn() -> io::Result<File>) -> io::Result<File> {
        open_freeing(&self.handles, open)
    }

    fn forget(&self, path: &Path) {
        self.handles.remove(path);
    }
}

impl LogStorage for FileStorage {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| io_error(e, "create directory", dir))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| io_error(e, "list", dir))? {
            let entry = entry.map_err(|e| io_error(e, "list", dir))?;
            let is_file = entry
                .file_type()
                .map_err(|e| io_error(e, "list", dir))?
                .is_file();
            if is_file {
                if let Some(name) = entry.file_name().to_str() {
                    names.push(name.to_string());
                }
            }
        }
        Ok(names)
    }

    fn create(&mut self, path: &Path) -> io::Result<()> {
        let file = self
            .open_freeing_handles(|| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(path)
            })
            .map_err(|e| io_error(e, "create", path))?;
        self.handles.insert(path, Arc::new(file));
        Ok(())
    }

    /// The size alone (`statx` without the times), so that checking a file does not make the
    /// next write to it dirty its inode (see [`file_size`]).
    fn len(&self, path: &Path) -> io::Result<u64> {
        path_size(path).map_err(|e| io_error(e, "stat", path))
    }

    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let file = self.handle(path, "append to")?;
        let end = file_size(&file).map_err(|e| io_error(e, "stat", path))?;
        file.write_all_at(bytes, end)
            .map_err(|e| io_error(e, "append to", path))
    }

    fn write_at(&mut self, path: &Path, position: u64, bytes: &[u8]) -> io::Result<()> {
        let file = self.handle(path, "write to")?;
        file.write_all_at(bytes, position)
            .map_err(|e| io_error(e, &format!("write at {position} of"), path))
    }

    fn read_at(&self, path: &Path, position: u64, buf: &mut [u8]) -> io::Result<()> {
        let file = match self.handle(path, "read") {
            Ok(file) => file,
            // Reading needs no write access: a read-only file or file system (a backup being
            // verified) is read through a read-only handle, not cached since appends need theirs.
            Err(error) if error.kind() != io::ErrorKind::NotFound => {
                Arc::new(File::open(path).map_err(|_| error)?)
            }
            Err(error) => return Err(error),
        };
        file.read_exact_at(buf, position).map_err(|e| {
            io_error(
                e,
                &format!("read {} bytes at {position} of", buf.len()),
                path,
            )
        })
    }

    fn sync(&mut self, path: &Path) -> io::Result<()> {
        let file = self.handle(path, "sync")?;
        file.sync_data().map_err(|e| io_error(e, "sync", path))
    }

    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        sync_directory(dir, &self.handles)
    }

    /// Captures the open handle: `sync_data` on it later flushes whatever the file holds then,
    /// which includes every byte written before this call (even if the file was removed since).
    fn sync_later(&mut self, path: &Path) -> io::Result<SyncFn> {
        let file = self.handle(path, "sync")?;
        let path = path.to_path_buf();
        Ok(Box::new(move || {
            file.sync_data().map_err(|e| io_error(e, "sync", &path))
        }))
    }

    fn sync_dir_later(&mut self, dir: &Path) -> io::Result<SyncFn> {
        let dir = dir.to_path_buf();
        let handles = self.handles.clone();
        Ok(Box::new(move || sync_directory(&dir, &handles)))
    }

    /// Captures the open handle: the closure writes the chunks at the file's end with
    /// `pwritev`, and then `fdatasync`s it if asked. A failed write cuts the file back to its
    /// length before the call, so that no partial entry is left for a later append to follow.
    fn append_later(&mut self, path: &Path) -> Option<io::Result<AppendFn>> {
        let file = match self.handle(path, "append to") {
            Ok(file) => file,
            Err(error) => return Some(Err(error)),
        };
        let path = path.to_path_buf();
        Some(Ok(Box::new(move |chunks: &[Bytes], sync: bool| {
            let end = file_size(&file).map_err(|e| io_error(e, "stat", &path))?;
            write_chunks_at(&file, &path, chunks, end)?;
            if sync {
                file.sync_data().map_err(|e| io_error(e, "sync", &path))?;
            }
            Ok(())
        })))
    }

    /// Captures the open handle: the closure writes the chunks at the position given with
    /// `pwritev`, `fdatasync`s the file if asked, and then keeps the room asked for (zeros
    /// written ahead, their write-back started at once so that the next sync finds them mostly
    /// on disk). A failed write cuts the file back to the position. Room that cannot be written
    /// (a full disk) is left out: it only saves work.
    fn write_later(&mut self, path: &Path, room: u64) -> Option<io::Result<WriteFn>> {
        let file = match self.handle(path, "write to") {
            Ok(file) => file,
            Err(error) => return Some(Err(error)),
        };
        let path = path.to_path_buf();
        Some(Ok(Box::new(
            move |chunks: &[Bytes], position: u64, sync: bool| {
                write_chunks_at(&file, &path, chunks, position)?;
                if sync {
                    file.sync_data().map_err(|e| io_error(e, "sync", &path))?;
                }
                if room > 0 {
                    let end = position + chunks.iter().map(|c| c.len() as u64).sum::<u64>();
                    if let Err(error) = keep_room(&file, end, room) {
                        tracing::debug!(file = %path.display(), %error, "could not write room ahead");
                    }
                }
                Ok(())
            },
        )))
    }

    fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()> {
        let file = self.handle(path, "truncate")?;
        file.set_len(len)
            .map_err(|e| io_error(e, &format!("truncate to {len} bytes"), path))
    }

    fn remove(&mut self, path: &Path) -> io::Result<()> {
        self.forget(path);
        std::fs::remove_file(path).map_err(|e| io_error(e, "remove", path))
    }
}

/// Writes every chunk, in order, from `position`, with as few `pwritev` calls as the kernel
/// allows; on failure cuts the file back to `position` (what this call wrote is then past the
/// entries) and returns the error.
fn write_chunks_at(file: &File, path: &Path, chunks: &[Bytes], position: u64) -> io::Result<()> {
    if let Err(error) = write_all_vectored_at(file, chunks, position) {
        if let Err(undo) = file.set_len(position) {
            tracing::error!(file = %path.display(), %error, %undo, "could not cut a failed write back");
        }
        return Err(io_error(error, &format!("write at {position} of"), path));
    }
    Ok(())
}

/// Writes every slice, in order, from `position`, with as few `pwritev` calls as the kernel
/// allows.
fn write_all_vectored_at<B: AsRef<[u8]>>(
    file: &File,
    slices: &[B],
    mut position: u64,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // At most this many slices per call (IOV_MAX on Linux is 1024).
    const SLICES_MAX: usize = 1024;
    // The next byte to write: slice `first`, from `skip`.
    let (mut first, mut skip) = (0usize, 0usize);
    // Bounded: every successful call writes at least one byte of a finite total.
    loop {
        while first < slices.len() && skip == slices[first].as_ref().len() {
            first += 1;
            skip = 0;
        }
        if first == slices.len() {
            return Ok(());
        }
        let iov: Vec<libc::iovec> = std::iter::once(&slices[first].as_ref()[skip..])
            .chain(slices[first + 1..].iter().map(AsRef::as_ref))
            .take(SLICES_MAX)
            .map(|s| libc::iovec {
                iov_base: s.as_ptr() as *mut libc::c_void,
                iov_len: s.len(),
            })
            .collect();
        let offset = libc::off_t::try_from(position).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "position past the largest file offset",
            )
        })?;
        // SAFETY: every iovec points into a slice borrowed for the whole call, with its length;
        // the descriptor belongs to `file`, open for the call.
        let written = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                offset,
            )
        };
        let mut written = match written {
            0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            n if n > 0 => n as usize,
            _ => {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(error);
            }
        };
        position += written as u64;
        while written > 0 {
            let left = slices[first].as_ref().len() - skip;
            if written >= left {
                written -= left;
                first += 1;
                skip = 0;
            } else {
                skip += written;
                written = 0;
            }
        }
    }
}

/// Zeros written at a time when room is kept: a static buffer, written as many slices.
const ZEROS_BYTES: usize = 64 * 1024;
static ZEROS: [u8; ZEROS_BYTES] = [0; ZEROS_BYTES];

/// Makes sure the file extends at least `room / 2` bytes past `end`, writing zeros up to
/// `end + room` when it does not, and starts their write-back.
fn keep_room(file: &File, end: u64, room: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let size = file_size(file)?;
    if size >= end + room / 2 {
        return Ok(());
    }
    let from = size.max(end);
    let to = end + room;
    let count = (to - from).div_ceil(ZEROS_BYTES as u64) as usize;
    let mut slices = vec![&ZEROS[..]; count];
    let last = (to - from) as usize - (count - 1) * ZEROS_BYTES;
    slices[count - 1] = &ZEROS[..last];
    write_all_vectored_at(file, &slices, from)?;
    // SAFETY: a plain system call on the file's own descriptor; no memory is passed.
    let started = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            from as libc::off64_t,
            (to - from) as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if started != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The size of an open file, through `statx` asking for the size alone. `std::fs::metadata`
/// asks for the times as well, and since Linux 6.13 a read of a file's change time makes the next
/// write to it take a fine-grained timestamp, which dirties the inode: every fdatasync after it
/// then writes the inode too, even when the file's size did not change.
fn file_size(file: &File) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    // An empty path with AT_EMPTY_PATH stats the descriptor itself.
    statx_size(file.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
}

/// The size of the file at `path`, as [`file_size`].
fn path_size(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    statx_size(libc::AT_FDCWD, &path, 0)
}

fn statx_size(dir: libc::c_int, path: &std::ffi::CStr, flags: libc::c_int) -> io::Result<u64> {
    // SAFETY: statx only writes into `stat`, a plain C struct for which zeroes are valid.
    let mut stat: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `stat` a valid struct, both outliving the call.
    let result = unsafe { libc::statx(dir, path.as_ptr(), flags, libc::STATX_SIZE, &mut stat) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.stx_size)
}

/// Runs `open`, and once more after closing the cached `handles` if it found no descriptor
/// free: the cache is the one user of descriptors this process can give back at will, so
/// connections or other storages that took the rest do not make a log fail.
fn open_freeing(handles: &FileHandles, open: impl Fn() -> io::Result<File>) -> io::Result<File> {
    match open() {
        Err(error) if is_out_of_open_files(&error) && !handles.is_empty() => {
            handles.close_all();
            open()
        }
        result => result,
    }
}

fn sync_directory(dir: &Path, handles: &FileHandles) -> io::Result<()> {
    let file = open_freeing(handles, || File::open(dir))
        .map_err(|e| io_error(e, "open directory", dir))?;
    file.sync_all()
        .map_err(|e| io_error(e, "sync directory", dir))
}

/// A small deterministic generator (SplitMix64) so that crashes and simulations replay exactly
/// from a seed without a dependency.
#[derive(Debug, Clone)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    pub fn new(seed: u64) -> Self {
        SimRng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound`; `bound` must be positive.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "SimRng::below(0)");
        self.next_u64() % bound
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }
}

#[derive(Debug, Clone, Default)]
struct MemoryFile {
    /// Tells a file from one created later under the same name, so that a deferred sync of a
    /// removed file does not make its successor durable.
    id: u64,
    /// What a reader sees now.
    current: Vec<u8>,
    /// What survives a crash for sure: the content as of the last `sync`.
    durable: Vec<u8>,
    /// Whether the file's name survives a crash (its directory was synced after creation).
    name_durable: bool,
}

impl MemoryFile {
    /// Length of the longest common prefix of the durable image and the current content: the
    /// bytes a crash cannot lose. Usually the file only grew since its last sync; the byte loop
    /// is for truncations.
    fn durable_prefix_len(&self) -> usize {
        if self.current.starts_with(&self.durable) {
            self.durable.len()
        } else {
            self.durable
                .iter()
                .zip(self.current.iter())
                .take_while(|(a, b)| a == b)
                .count()
        }
    }

    /// Writes `bytes` at `position` of the current content, overwriting or extending it.
    fn write_at(&mut self, path: &Path, position: u64, bytes: &[u8]) -> io::Result<()> {
        let start = usize::try_from(position).unwrap_or(usize::MAX);
        if start > self.current.len() {
            return Err(io_error(
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "a write at {position} would leave a hole after byte {}",
                        self.current.len()
                    ),
                ),
                "write to",
                path,
            ));
        }
        let end = start + bytes.len();
        if end > self.current.len() {
            self.current.resize(end, 0);
        }
        self.current[start..end].copy_from_slice(bytes);
        Ok(())
    }

    /// Makes the first `len` bytes of the current content durable (all of it, including a
    /// truncation, when `len` is the current length). Never makes durable bytes less durable.
    fn make_durable(&mut self, len: usize) {
        let len = len.min(self.current.len());
        let common = self.durable_prefix_len();
        if common < len {
            self.durable.truncate(common);
            self.durable.extend_from_slice(&self.current[common..len]);
        } else if len == self.current.len() {
            self.durable.truncate(len);
        }
    }
}

/// A [`MemoryStorage`] deferred write: chunks, the position (`None`: the end), whether to sync.
type CapturedWrite = Box<dyn FnOnce(&[Bytes], Option<u64>, bool) -> io::Result<()> + Send>;

/// The simulated disk that every clone of a [`MemoryStorage`] shares.
#[derive(Debug, Clone, Default)]
struct MemoryDisk {
    /// Keyed by the path's bytes: ordered (so a crash visits files in a fixed order) and compared
    /// with memcmp rather than component by component.
    files: BTreeMap<OsString, MemoryFile>,
    dirs: Vec<PathBuf>,
    /// The id the next created file gets.
    next_file_id: u64,
    /// Syncs still to fail (see [`MemoryStorage::fail_next_syncs`]).
    sync_failures_injected: u64,
}

impl MemoryDisk {
    fn file(&self, path: &Path, operation: &str) -> io::Result<&MemoryFile> {
        self.files
            .get(path.as_os_str())
            .ok_or_else(|| io_error(io::Error::from(io::ErrorKind::NotFound), operation, path))
    }

    fn file_mut(&mut self, path: &Path, operation: &str) -> io::Result<&mut MemoryFile> {
        self.files
            .get_mut(path.as_os_str())
            .ok_or_else(|| io_error(io::Error::from(io::ErrorKind::NotFound), operation, path))
    }

    /// Consumes one injected sync failure, if any is armed, as the error of this sync.
    fn injected_sync_failure(&mut self, operation: &str, path: &Path) -> io::Result<()> {
        if self.sync_failures_injected == 0 {
            return Ok(());
        }
        self.sync_failures_injected -= 1;
        Err(io_error(
            io::Error::other("injected I/O error"),
            operation,
            path,
        ))
    }

    /// Ids of the files directly in `dir`.
    fn ids_in(&self, dir: &Path) -> Vec<(OsString, u64)> {
        self.files
            .iter()
            .filter(|(path, _)| Path::new(path).parent() == Some(dir))
            .map(|(path, file)| (path.clone(), file.id))
            .collect()
    }
}

/// Files in memory that model what a power loss does to unsynced data.
///
/// Model: the bytes a file had at its last `sync` survive a crash; the bytes after the longest
/// common prefix of that durable image and the current content are unsynced, and a crash keeps
/// none of them, a prefix of them, or a prefix followed by garbage. A file created since its
/// directory was last synced may vanish. Removal takes effect at once and durably (a simplification:
/// the log only removes whole old segments, oldest first, so a resurrected one would be harmless).
///
/// A `MemoryStorage` is a handle: clones share one simulated disk (so that a deferred sync, a
/// test, or a crash can reach it while a log owns another handle). [`MemoryStorage::snapshot`]
/// copies the disk instead. A deferred sync makes durable exactly the bytes the file had when it
/// was captured, never the ones written after, so that a caller claiming too much is caught.
#[derive(Debug, Clone, Default)]
pub struct MemoryStorage {
    disk: Arc<Mutex<MemoryDisk>>,
}

fn lock_disk(disk: &Mutex<MemoryDisk>) -> MutexGuard<'_, MemoryDisk> {
    // A panic while the lock was held (a failed assertion in a test) leaves the disk consistent:
    // every operation completes its change before it can panic.
    disk.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl MemoryStorage {
    pub fn new() -> Self {
        Self::default()
    }

    fn disk(&self) -> MutexGuard<'_, MemoryDisk> {
        lock_disk(&self.disk)
    }

    /// The deferred write behind [`LogStorage::append_later`] and [`LogStorage::write_later`]: the
    /// closure writes the chunks at the position given (`None`: at the end) if the file is still
    /// the one captured (a removed file's successor is not written), makes all of its content
    /// durable if asked, then keeps `room` zeros past the chunks.
    fn captured_write(
        &self,
        path: &Path,
        operation: &'static str,
        room: u64,
    ) -> io::Result<CapturedWrite> {
        let id = self.disk().file(path, operation)?.id;
        let disk = Arc::clone(&self.disk);
        let path = path.to_path_buf();
        Ok(Box::new(
            move |chunks: &[Bytes], position: Option<u64>, sync: bool| {
                let mut disk = lock_disk(&disk);
                let file = disk.file_mut(&path, operation)?;
                if file.id != id {
                    return Err(io_error(
                        io::Error::from(io::ErrorKind::NotFound),
                        operation,
                        &path,
                    ));
                }
                let mut at = position.unwrap_or(file.current.len() as u64);
                for chunk in chunks {
                    file.write_at(&path, at, chunk)?;
                    at += chunk.len() as u64;
                }
                if sync {
                    disk.injected_sync_failure("sync", &path)?;
                    let file = disk.file_mut(&path, "sync")?;
                    let len = file.current.len();
                    file.make_durable(len);
                }
                let file = disk.file_mut(&path, operation)?;
                let end = usize::try_from(at).unwrap_or(usize::MAX);
                let room = usize::try_from(room).unwrap_or(usize::MAX);
                if room > 0 && file.current.len() < end.saturating_add(room / 2) {
                    file.current.resize(end + room, 0);
                }
                Ok(())
            },
        ))
    }

    /// An independent copy of the disk as it is now: later changes to either do not show in the
    /// other.
    pub fn snapshot(&self) -> MemoryStorage {
        MemoryStorage {
            disk: Arc::new(Mutex::new(self.disk().clone())),
        }
    }

    /// Makes the next `count` syncs (of files or directories, immediate or deferred; a deferred
    /// one counts when its closure runs) fail with an injected I/O error and make nothing durable.
    pub fn fail_next_syncs(&self, count: u64) {
        self.disk().sync_failures_injected = count;
    }

    /// Simulates a power loss: every file keeps its durable bytes and, decided by `seed`, none,
    /// a prefix, or a prefix plus garbage of its unsynced bytes; files whose names were never
    /// made durable may vanish. Afterwards what is left is, by definition, on disk.
    pub fn crash(&self, seed: u64) {
        let mut rng = SimRng::new(seed);
        let mut disk = self.disk();
        let mut vanished = Vec::new();
        for (path, file) in disk.files.iter_mut() {
            if !file.name_durable && rng.chance(1, 2) {
                vanished.push(path.clone());
                continue;
            }
            let common = file.durable_prefix_len();
            let unsynced = &file.current[common..];
            let mut survived = file.current[..common].to_vec();
            match rng.below(3) {
                0 => {}
                1 => {
                    let keep = rng.below(unsynced.len() as u64 + 1) as usize;
                    survived.extend_from_slice(&unsynced[..keep]);
                }
                _ => {
                    let keep = rng.below(unsynced.len() as u64 + 1) as usize;
                    survived.extend_from_slice(&unsynced[..keep]);
                    // Garbage no longer than what was being written: a torn sector, not growth.
                    let garbage = rng.below((unsynced.len() - keep) as u64 + 1) as usize;
                    for _ in 0..garbage {
                        survived.push(rng.next_u64() as u8);
                    }
                }
            }
            file.current = survived.clone();
            file.durable = survived;
            file.name_durable = true;
        }
        for path in vanished {
            disk.files.remove(&path);
        }
    }

    /// Flips one bit of a file's content, durably: a disk that rots, for corruption tests.
    pub fn flip_bit(&self, path: &Path, position: u64, bit: u8) -> io::Result<()> {
        let mut disk = self.disk();
        let file = disk.file_mut(path, "flip a bit in")?;
        let byte = file.current.get_mut(position as usize).ok_or_else(|| {
            io_error(
                io::Error::from(io::ErrorKind::UnexpectedEof),
                "flip a bit in",
                path,
            )
        })?;
        *byte ^= 1 << (bit % 8);
        file.durable = file.current.clone();
        Ok(())
    }

    /// The paths of all files, for tests that damage or inspect them.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.disk().files.keys().map(PathBuf::from).collect()
    }
}

impl LogStorage for MemoryStorage {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        let mut disk = self.disk();
        if !disk.dirs.iter().any(|d| d == dir) {
            disk.dirs.push(dir.to_path_buf());
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let disk = self.disk();
        if !disk.dirs.iter().any(|d| d == dir) {
            return Err(io_error(
                io::Error::from(io::ErrorKind::NotFound),
                "list",
                dir,
            ));
        }
        Ok(disk
            .files
            .keys()
            .map(Path::new)
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
            .collect())
    }

    fn create(&mut self, path: &Path) -> io::Result<()> {
        let mut disk = self.disk();
        if disk.files.contains_key(path.as_os_str()) {
            return Err(io_error(
                io::Error::from(io::ErrorKind::AlreadyExists),
                "create",
                path,
            ));
        }
        let id = disk.next_file_id;
        disk.next_file_id += 1;
        disk.files.insert(
            path.as_os_str().to_os_string(),
            MemoryFile {
                id,
                ..MemoryFile::default()
            },
        );
        Ok(())
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        Ok(self.disk().file(path, "stat")?.current.len() as u64)
    }

    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.disk()
            .file_mut(path, "append to")?
            .current
            .extend_from_slice(bytes);
        Ok(())
    }

    fn read_at(&self, path: &Path, position: u64, buf: &mut [u8]) -> io::Result<()> {
        let disk = self.disk();
        let file = disk.file(path, "read")?;
        let start = usize::try_from(position).unwrap_or(usize::MAX);
        let end = start.saturating_add(buf.len());
        if end > file.current.len() {
            return Err(io_error(
                io::Error::from(io::ErrorKind::UnexpectedEof),
                &format!("read {} bytes at {position} of", buf.len()),
                path,
            ));
        }
        buf.copy_from_slice(&file.current[start..end]);
        Ok(())
    }

    fn sync(&mut self, path: &Path) -> io::Result<()> {
        let mut disk = self.disk();
        disk.file(path, "sync")?;
        disk.injected_sync_failure("sync", path)?;
        let file = disk.file_mut(path, "sync")?;
        let len = file.current.len();
        file.make_durable(len);
        Ok(())
    }

    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        let mut disk = self.disk();
        disk.injected_sync_failure("sync directory", dir)?;
        for (path, file) in disk.files.iter_mut() {
            if Path::new(path).parent() == Some(dir) {
                file.name_durable = true;
            }
        }
        Ok(())
    }

    /// Records the file's length now; the closure makes durable that prefix of the content the
    /// file then has (if it is still the same file), and nothing written after this call.
    fn sync_later(&mut self, path: &Path) -> io::Result<SyncFn> {
        let (id, len) = {
            let disk = self.disk();
            let file = disk.file(path, "sync")?;
            (file.id, file.current.len())
        };
        let disk = Arc::clone(&self.disk);
        let path = path.to_path_buf();
        Ok(Box::new(move || {
            let mut disk = lock_disk(&disk);
            disk.injected_sync_failure("sync", &path)?;
            if let Some(file) = disk.files.get_mut(path.as_os_str()) {
                if file.id == id {
                    file.make_durable(len);
                }
            }
            Ok(())
        }))
    }

    /// Records which files the directory holds now; the closure makes their names durable (those
    /// still there), not the names of files created after this call.
    fn sync_dir_later(&mut self, dir: &Path) -> io::Result<SyncFn> {
        let files = self.disk().ids_in(dir);
        let disk = Arc::clone(&self.disk);
        let dir = dir.to_path_buf();
        Ok(Box::new(move || {
            let mut disk = lock_disk(&disk);
            disk.injected_sync_failure("sync directory", &dir)?;
            for (path, id) in files {
                if let Some(file) = disk.files.get_mut(&path) {
                    if file.id == id {
                        file.name_durable = true;
                    }
                }
            }
            Ok(())
        }))
    }

    /// The closure appends to the file if it is still the one captured (a removed file's
    /// successor is not written), then makes all of its content durable if asked.
    fn append_later(&mut self, path: &Path) -> Option<io::Result<AppendFn>> {
        let write = match self.captured_write(path, "append to", 0) {
            Ok(write) => write,
            Err(error) => return Some(Err(error)),
        };
        Some(Ok(Box::new(move |chunks: &[Bytes], sync: bool| {
            write(chunks, None, sync)
        })))
    }

    /// Overwrites (zeros of kept room) or extends the content; a position past the end, which
    /// would leave a hole, is refused as the caller's bug.
    fn write_at(&mut self, path: &Path, position: u64, bytes: &[u8]) -> io::Result<()> {
        let mut disk = self.disk();
        disk.file_mut(path, "write to")?
            .write_at(path, position, bytes)
    }

    /// As [`FileStorage::write_later`]: the room is zeros added to the content (unsynced, so a
    /// crash may keep any prefix of them, or garbage in their place).
    fn write_later(&mut self, path: &Path, room: u64) -> Option<io::Result<WriteFn>> {
        let write = match self.captured_write(path, "write to", room) {
            Ok(write) => write,
            Err(error) => return Some(Err(error)),
        };
        Some(Ok(Box::new(
            move |chunks: &[Bytes], position: u64, sync: bool| write(chunks, Some(position), sync),
        )))
    }

    fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()> {
        let mut disk = self.disk();
        let file = disk.file_mut(path, "truncate")?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        file.current.truncate(len);
        Ok(())
    }

    fn remove(&mut self, path: &Path) -> io::Result<()> {
        self.disk()
            .files
            .remove(path.as_os_str())
            .map(|_| ())
            .ok_or_else(|| io_error(io::Error::from(io::ErrorKind::NotFound), "remove", path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_descriptors_is_named_with_the_limit_and_told_apart() {
        let path = Path::new("/data/topics/t/0/00000000000000000000.log");
        let error = io_error(io::Error::from_raw_os_error(libc::EMFILE), "open", path);
        let message = error.to_string();
        assert!(message.starts_with("open /data/topics/t/0/"), "{message}");
        assert!(message.contains("too many open files"), "{message}");
        let limit = open_files_limit().expect("a finite limit in tests");
        assert!(
            message.contains(&format!("open-files limit is {limit}")),
            "{message}"
        );
        assert!(message.contains("ulimit -n"), "{message}");
        assert!(is_out_of_open_files(&error));
        assert!(crate::LogError::Io(error).is_out_of_open_files());

        let system = io_error(io::Error::from_raw_os_error(libc::ENFILE), "open", path);
        assert!(is_out_of_open_files(&system));
        assert!(system.to_string().contains("fs.file-max"), "{system}");

        let other = io_error(io::Error::from_raw_os_error(libc::EIO), "open", path);
        assert!(!is_out_of_open_files(&other));
        assert!(!crate::LogError::Io(other).is_out_of_open_files());
    }

    #[test]
    fn an_open_out_of_descriptors_closes_the_cached_handles_and_tries_again() {
        let dir = std::env::temp_dir().join(format!("ferrymq-handles-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let handles = FileHandles::new(8);
        let mut storage = FileStorage::with_handles(handles.clone());
        for name in ["a", "b", "c"] {
            storage.create(&dir.join(name)).unwrap();
        }
        assert_eq!(handles.len(), 3);
        let attempts = std::cell::Cell::new(0);
        let file = open_freeing(&handles, || {
            attempts.set(attempts.get() + 1);
            if attempts.get() == 1 {
                Err(io::Error::from_raw_os_error(libc::EMFILE))
            } else {
                File::open(dir.join("a"))
            }
        });
        assert!(file.is_ok());
        assert_eq!(attempts.get(), 2);
        assert!(handles.is_empty(), "the cached handles were closed");
        // With nothing left to close, the error is the caller's.
        let error = open_freeing(&handles, || Err(io::Error::from_raw_os_error(libc::EMFILE)));
        assert_eq!(error.unwrap_err().raw_os_error(), Some(libc::EMFILE));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn exercise(storage: &mut dyn LogStorage, dir: &Path) {
        storage.create_dir_all(dir).unwrap();
        let path = dir.join("a.log");
        storage.create(&path).unwrap();
        assert_eq!(
            storage.create(&path).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        storage.append(&path, b"hello ").unwrap();
        storage.append(&path, b"world").unwrap();
        assert_eq!(storage.len(&path).unwrap(), 11);
        let mut buf = [0u8; 5];
        storage.read_at(&path, 6, &mut buf).unwrap();
        assert_eq!(&buf, b"world");
        let err = storage.read_at(&path, 8, &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(err.to_string().contains("a.log"), "{err}");
        storage.sync(&path).unwrap();
        storage.sync_dir(dir).unwrap();
        storage.truncate(&path, 5).unwrap();
        storage.append(&path, b"!").unwrap();
        let mut buf = [0u8; 6];
        storage.read_at(&path, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"hello!");
        assert_eq!(storage.list(dir).unwrap(), vec!["a.log".to_string()]);
        storage.remove(&path).unwrap();
        assert!(!storage.exists(&path));
        let err = storage.len(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("a.log"), "{err}");
    }

    #[test]
    fn file_storage_does_what_the_trait_says() {
        let dir = std::env::temp_dir().join(format!("ferrymq-storage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        exercise(&mut FileStorage::new(), &dir);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn memory_storage_does_what_the_trait_says() {
        exercise(&mut MemoryStorage::new(), Path::new("/p"));
    }

    #[test]
    fn crash_keeps_synced_bytes_and_a_prefix_or_garbage_of_the_rest() {
        let dir = Path::new("/p");
        let path = dir.join("a.log");
        let mut outcomes = [0usize; 3];
        for seed in 0..300 {
            let mut storage = MemoryStorage::new();
            storage.create_dir_all(dir).unwrap();
            storage.create(&path).unwrap();
            storage.sync_dir(dir).unwrap();
            storage.append(&path, b"synced").unwrap();
            storage.sync(&path).unwrap();
            storage.append(&path, b"-unsynced").unwrap();
            storage.crash(seed);
            let len = storage.len(&path).unwrap() as usize;
            let mut buf = vec![0u8; len];
            storage.read_at(&path, 0, &mut buf).unwrap();
            assert!(buf.starts_with(b"synced"), "seed {seed}");
            assert!(len <= b"synced-unsynced".len(), "seed {seed}");
            if len == 6 {
                outcomes[0] += 1;
            } else if b"synced-unsynced".starts_with(&buf) {
                outcomes[1] += 1;
            } else {
                outcomes[2] += 1;
            }
            // Same seed, same crash.
            let mut again = MemoryStorage::new();
            again.create_dir_all(dir).unwrap();
            again.create(&path).unwrap();
            again.sync_dir(dir).unwrap();
            again.append(&path, b"synced").unwrap();
            again.sync(&path).unwrap();
            again.append(&path, b"-unsynced").unwrap();
            again.crash(seed);
            let mut buf2 = vec![0u8; len];
            again.read_at(&path, 0, &mut buf2).unwrap();
            assert_eq!(buf, buf2, "seed {seed}");
        }
        assert!(outcomes.iter().all(|&n| n > 0), "{outcomes:?}");
    }

    #[test]
    fn crash_may_lose_a_file_whose_directory_was_not_synced() {
        let dir = Path::new("/p");
        let mut lost = 0;
        for seed in 0..50 {
            let mut storage = MemoryStorage::new();
            storage.create_dir_all(dir).unwrap();
            storage.create(&dir.join("a")).unwrap();
            storage.sync(&dir.join("a")).unwrap();
            storage.crash(seed);
            if !storage.exists(&dir.join("a")) {
                lost += 1;
            }
        }
        assert!(lost > 0 && lost < 50, "{lost}");
    }

    /// The content of a file in a crashed copy of `storage`.
    fn after_crash(storage: &MemoryStorage, path: &Path, seed: u64) -> Option<Vec<u8>> {
        let copy = storage.snapshot();
        copy.crash(seed);
        let len = copy.len(path).ok()? as usize;
        let mut buf = vec![0u8; len];
        copy.read_at(path, 0, &mut buf).unwrap();
        Some(buf)
    }

    #[test]
    fn a_deferred_sync_covers_exactly_what_was_written_before_it_was_captured() {
        let dir = Path::new("/p");
        let path = dir.join("a.log");
        let mut storage = MemoryStorage::new();
        storage.create_dir_all(dir).unwrap();
        storage.create(&path).unwrap();
        storage.sync_dir(dir).unwrap();
        storage.append(&path, b"before").unwrap();
        let sync = storage.sync_later(&path).unwrap();
        storage.append(&path, b"-after").unwrap();
        // Run on another thread, as the broker does.
        std::thread::spawn(sync).join().unwrap().unwrap();
        let mut lost_after = 0;
        for seed in 0..100 {
            let buf = after_crash(&storage, &path, seed).unwrap();
            assert!(buf.starts_with(b"before"), "seed {seed}");
            lost_after += usize::from(!buf.starts_with(b"before-after"));
        }
        assert!(
            lost_after > 0,
            "the deferred sync covered bytes written after it"
        );
        // A later sync of more is not undone by an earlier deferred one finishing late.
        let late = storage.sync_later(&path).unwrap();
        storage.sync(&path).unwrap();
        late().unwrap();
        for seed in 0..20 {
            assert_eq!(
                after_crash(&storage, &path, seed).unwrap(),
                b"before-after",
                "seed {seed}"
            );
        }
    }

    #[test]
    fn a_deferred_directory_sync_covers_the_names_created_before_it() {
        let dir = Path::new("/p");
        let mut storage = MemoryStorage::new();
        storage.create_dir_all(dir).unwrap();
        storage.create(&dir.join("old")).unwrap();
        let sync = storage.sync_dir_later(dir).unwrap();
        storage.create(&dir.join("new")).unwrap();
        sync().unwrap();
        let mut new_lost = 0;
        for seed in 0..50 {
            let copy = storage.snapshot();
            copy.crash(seed);
            assert!(copy.exists(&dir.join("old")), "seed {seed}");
            new_lost += usize::from(!copy.exists(&dir.join("new")));
        }
        assert!(new_lost > 0);
    }

    #[test]
    fn a_deferred_sync_of_a_removed_file_does_not_cover_its_successor() {
        let dir = Path::new("/p");
        let path = dir.join("a.log");
        let mut storage = MemoryStorage::new();
        storage.create_dir_all(dir).unwrap();
        storage.create(&path).unwrap();
        storage.append(&path, b"first").unwrap();
        let sync = storage.sync_later(&path).unwrap();
        storage.remove(&path).unwrap();
        storage.create(&path).unwrap();
        storage.sync_dir(dir).unwrap();
        storage.append(&path, b"second").unwrap();
        sync().unwrap();
        assert!((0..50).any(|seed| after_crash(&storage, &path, seed).unwrap().is_empty()));
    }

    #[test]
    fn injected_sync_failures_hit_immediate_and_deferred_syncs_and_make_nothing_durable() {
        let dir = Path::new("/p");
        let path = dir.join("a.log");
        let mut storage = MemoryStorage::new();
        storage.create_dir_all(dir).unwrap();
        storage.create(&path).unwrap();
        storage.sync_dir(dir).unwrap();
        storage.append(&path, b"data").unwrap();
        // Armed through a clone: every clone is a handle to the same disk.
        storage.clone().fail_next_syncs(2);
        let deferred = storage.sync_later(&path).unwrap();
        let err = storage.sync(&path).unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
        let err = deferred().unwrap_err();
        assert!(err.to_string().contains("a.log"), "{err}");
        assert!((0..50).any(|seed| after_crash(&storage, &path, seed).unwrap().is_empty()));
        storage.sync_later(&path).unwrap()().unwrap();
        assert_eq!(after_crash(&storage, &path, 0).unwrap(), b"data");
    }

    #[test]
    fn clones_share_one_disk_and_snapshots_copy_it() {
        let dir = Path::new("/p");
        let mut storage = MemoryStorage::new();
        storage.create_dir_all(dir).unwrap();
        let snapshot = storage.snapshot();
        let mut clone = storage.clone();
        clone.create(&dir.join("a")).unwrap();
        assert!(storage.exists(&dir.join("a")));
        assert!(!snapshot.exists(&dir.join("a")));
        // A crash through any handle is seen through all of them.
        clone.crash(1);
        assert_eq!(storage.paths(), clone.paths());
    }

    #[test]
    fn file_storage_defers_syncs_to_another_thread() {
        let dir =
            std::env::temp_dir().join(format!("ferrymq-storage-later-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut storage: Box<dyn LogStorage + Send> = Box::new(FileStorage::new());
        storage.create_dir_all(&dir).unwrap();
        let path = dir.join("a.log");
        storage.create(&path).unwrap();
        storage.append(&path, b"bytes").unwrap();
        let file_sync = storage.sync_later(&path).unwrap();
        let dir_sync = storage.sync_dir_later(&dir).unwrap();
        // The file may be removed before the sync runs: the captured handle still syncs.
        storage.remove(&path).unwrap();
        std::thread::spawn(move || {
            file_sync()?;
            dir_sync()
        })
        .join()
        .unwrap()
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let err = storage.sync_dir_later(&dir).unwrap()().unwrap_err();
        assert!(err.to_string().contains("ferrymq-storage-later"), "{err}");
    }
}
