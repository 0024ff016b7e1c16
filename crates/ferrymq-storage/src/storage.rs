//! The storage seam: the few file operations the log needs, behind one trait.
//!
//! Invariants every implementation keeps:
//! - Files are addressed by path; there are no handles to leak or to outlive a removal.
//! - `append` only ever adds bytes at the end; the log never overwrites in place.
//! - Bytes are durable only after `sync` of that file returned `Ok`, and a newly created file's
//!   name is durable only after `sync_dir` of its directory returned `Ok`.
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
use std::sync::{Arc, Mutex};

/// The file operations the partition log needs, and nothing more.
pub trait Storage {
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

    /// Whether the file exists. Any error other than "not found" counts as present, so the caller
    /// meets the real error on its next operation rather than recreating a file it cannot see.
    fn exists(&self, path: &Path) -> bool {
        match self.len(path) {
            Ok(_) => true,
            Err(e) => e.kind() != io::ErrorKind::NotFound,
        }
    }
}

/// Wraps an I/O error with the operation and the path, keeping its kind.
pub(crate) fn io_error(error: io::Error, operation: &str, path: &Path) -> io::Error {
    io::Error::new(
        error.kind(),
        format!("{operation} {}: {error}", path.display()),
    )
}

/// Most file handles [`FileStorage`] keeps open. A partition has three files per segment; past
/// this the cache is emptied and handles are reopened on demand, so descriptors stay bounded
/// however many segments a partition keeps.
const OPEN_FILES_MAX: usize = 64;

/// Files on a real file system, through `std::fs`. Durability is `File::sync_data` (fdatasync).
#[derive(Debug, Default)]
pub struct FileStorage {
    /// Open handles by path: appends and positional reads reuse them instead of reopening.
    /// A mutex because reads take `&self`.
    handles: Mutex<HashMap<PathBuf, Arc<File>>>,
}

impl FileStorage {
    pub fn new() -> Self {
        Self::default()
    }

    fn handle(&self, path: &Path, operation: &str) -> io::Result<Arc<File>> {
        let mut handles = self
            .handles
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(file) = handles.get(path) {
            return Ok(Arc::clone(file));
        }
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(path)
            .map_err(|e| io_error(e, operation, path))?;
        if handles.len() >= OPEN_FILES_MAX {
            handles.clear();
        }
        let file = Arc::new(file);
        handles.insert(path.to_path_buf(), Arc::clone(&file));
        Ok(file)
    }

    fn forget(&self, path: &Path) {
        self.handles
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(path);
    }
}

impl Storage for FileStorage {
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
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(path)
            .map_err(|e| io_error(e, "create", path))?;
        let mut handles = self
            .handles
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if handles.len() >= OPEN_FILES_MAX {
            handles.clear();
        }
        handles.insert(path.to_path_buf(), Arc::new(file));
        Ok(())
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(|e| io_error(e, "stat", path))
    }

    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        let file = self.handle(path, "append to")?;
        (&*file)
            .write_all(bytes)
            .map_err(|e| io_error(e, "append to", path))
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
        let file = File::open(dir).map_err(|e| io_error(e, "open directory", dir))?;
        file.sync_all()
            .map_err(|e| io_error(e, "sync directory", dir))
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
    /// What a reader sees now.
    current: Vec<u8>,
    /// What survives a crash for sure: the content as of the last `sync`.
    durable: Vec<u8>,
    /// Whether the file's name survives a crash (its directory was synced after creation).
    name_durable: bool,
}

/// Files in memory that model what a power loss does to unsynced data.
///
/// Model: the bytes a file had at its last `sync` survive a crash; the bytes after the longest
/// common prefix of that durable image and the current content are unsynced, and a crash keeps
/// none of them, a prefix of them, or a prefix followed by garbage. A file created since its
/// directory was last synced may vanish. Removal takes effect at once and durably (a simplification:
/// the log only removes whole old segments, oldest first, so a resurrected one would be harmless).
#[derive(Debug, Clone, Default)]
pub struct MemoryStorage {
    /// Keyed by the path's bytes: ordered (so a crash visits files in a fixed order) and compared
    /// with memcmp rather than component by component.
    files: BTreeMap<OsString, MemoryFile>,
    dirs: Vec<PathBuf>,
}

impl MemoryStorage {
    pub fn new() -> Self {
        Self::default()
    }

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

    /// Simulates a power loss: every file keeps its durable bytes and, decided by `seed`, none,
    /// a prefix, or a prefix plus garbage of its unsynced bytes; files whose names were never
    /// made durable may vanish. Afterwards what is left is, by definition, on disk.
    pub fn crash(&mut self, seed: u64) {
        let mut rng = SimRng::new(seed);
        let mut vanished = Vec::new();
        for (path, file) in self.files.iter_mut() {
            if !file.name_durable && rng.chance(1, 2) {
                vanished.push(path.clone());
                continue;
            }
            // Usually the file only grew since its last sync; the byte loop is for truncations.
            let common = if file.current.starts_with(&file.durable) {
                file.durable.len()
            } else {
                file.durable
                    .iter()
                    .zip(file.current.iter())
                    .take_while(|(a, b)| a == b)
                    .count()
            };
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
            self.files.remove(&path);
        }
    }

    /// Flips one bit of a file's content, durably: a disk that rots, for corruption tests.
    pub fn flip_bit(&mut self, path: &Path, position: u64, bit: u8) -> io::Result<()> {
        let file = self.file_mut(path, "flip a bit in")?;
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
        self.files.keys().map(PathBuf::from).collect()
    }
}

impl Storage for MemoryStorage {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        if !self.dirs.iter().any(|d| d == dir) {
            self.dirs.push(dir.to_path_buf());
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        if !self.dirs.iter().any(|d| d == dir) {
            return Err(io_error(
                io::Error::from(io::ErrorKind::NotFound),
                "list",
                dir,
            ));
        }
        Ok(self
            .files
            .keys()
            .map(Path::new)
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
            .collect())
    }

    fn create(&mut self, path: &Path) -> io::Result<()> {
        if self.files.contains_key(path.as_os_str()) {
            return Err(io_error(
                io::Error::from(io::ErrorKind::AlreadyExists),
                "create",
                path,
            ));
        }
        self.files
            .insert(path.as_os_str().to_os_string(), MemoryFile::default());
        Ok(())
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        Ok(self.file(path, "stat")?.current.len() as u64)
    }

    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.file_mut(path, "append to")?
            .current
            .extend_from_slice(bytes);
        Ok(())
    }

    fn read_at(&self, path: &Path, position: u64, buf: &mut [u8]) -> io::Result<()> {
        let file = self.file(path, "read")?;
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
        let file = self.file_mut(path, "sync")?;
        file.durable = file.current.clone();
        Ok(())
    }

    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        for (path, file) in self.files.iter_mut() {
            if Path::new(path).parent() == Some(dir) {
                file.name_durable = true;
            }
        }
        Ok(())
    }

    fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()> {
        let file = self.file_mut(path, "truncate")?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        file.current.truncate(len);
        Ok(())
    }

    fn remove(&mut self, path: &Path) -> io::Result<()> {
        self.files
            .remove(path.as_os_str())
            .map(|_| ())
            .ok_or_else(|| io_error(io::Error::from(io::ErrorKind::NotFound), "remove", path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(storage: &mut dyn Storage, dir: &Path) {
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
}
