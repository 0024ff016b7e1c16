//! [`SimBlockFile`]: an in-memory random-access file for redb ([`redb::StorageBackend`]) that
//! models what a power loss does to data written since the last `sync_data`, so that the
//! broker's metadata and ack state in redb can be tested against crashes deterministically.
//!
//! Model (sector granularity, like a disk): the content as of the last `sync_data` is kept apart
//! from the current content, with the set of 512-byte sectors written or resized since. A crash
//! keeps, for each such sector independently, its old or its new content (decided by a seed), and
//! the length becomes either the synced or the current length; bytes beyond the version a sector
//! keeps read as zeros. A sector is never torn inside: disks write sectors atomically (redb's
//! 320-byte header, with its two commit slots, lives in the first sector).
//!
//! A handle is cheap to clone and every clone shares the one file, but a crash kills the handles
//! that existed before it (the old `Database` is on the machine that lost power): every operation
//! through them fails, so dropping that `Database` afterwards cannot write. Clone the file after
//! the crash to hand a live handle to a fresh `Database`.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::storage::SimRng;

/// The unit a crash keeps or loses whole.
pub const SECTOR_BYTES: u64 = 512;

#[derive(Debug, Default)]
struct Disk {
    /// What a reader sees now.
    current: Vec<u8>,
    /// The content as of the last `sync_data`: what survives a crash for sure where no sector
    /// changed since.
    synced: Vec<u8>,
    /// Sectors written, grown or cut since the last `sync_data`. Ordered, so that a crash visits
    /// them in a fixed order and replays exactly from its seed.
    dirty: BTreeSet<u64>,
    /// Bumped by every crash: handles of an older epoch belong to the machine that lost power.
    epoch: u64,
    /// A power loss armed by [`SimBlockFile::crash_after_operations`]: mutating operations still
    /// allowed, and the crash's seed.
    armed: Option<(u64, u64)>,
}

impl Disk {
    fn mark_dirty(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        for sector in start / SECTOR_BYTES..end.div_ceil(SECTOR_BYTES) {
            self.dirty.insert(sector);
        }
    }

    fn crash(&mut self, seed: u64) {
        let mut rng = SimRng::new(seed);
        let len = if rng.chance(1, 2) {
            self.synced.len()
        } else {
            self.current.len()
        };
        let mut survived = self.synced.clone();
        survived.resize(len, 0);
        for &sector in &self.dirty {
            let start = (sector * SECTOR_BYTES) as usize;
            if start >= len {
                break;
            }
            let end = (start + SECTOR_BYTES as usize).min(len);
            let keep_new = rng.chance(1, 2);
            let version = if keep_new {
                &self.current
            } else {
                &self.synced
            };
            for (i, byte) in survived[start..end].iter_mut().enumerate() {
                *byte = version.get(start + i).copied().unwrap_or(0);
            }
        }
        self.current = survived.clone();
        self.synced = survived;
        self.dirty.clear();
        self.epoch += 1;
        self.armed = None;
    }
}

/// A simulated block file for redb that can lose power. See the module documentation.
pub struct SimBlockFile {
    disk: Arc<Mutex<Disk>>,
    /// The disk's epoch when this handle was made; the handle is dead once it differs.
    epoch: u64,
}

fn lock(disk: &Mutex<Disk>) -> MutexGuard<'_, Disk> {
    // Every operation completes its change before anything can panic, so a poisoned disk is
    // still consistent.
    disk.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SimBlockFile {
    /// An empty file.
    pub fn new() -> Self {
        SimBlockFile {
            disk: Arc::new(Mutex::new(Disk::default())),
            epoch: 0,
        }
    }

    /// Simulates a power loss now (see the module documentation), decided by `seed`. Handles
    /// that exist now are dead afterwards; clone one to get a live handle. Disarms any power
    /// loss armed by [`SimBlockFile::crash_after_operations`].
    pub fn crash(&self, seed: u64) {
        lock(&self.disk).crash(seed);
    }

    /// Arms a power loss, decided by `seed`, just before the `(count + 1)`-th mutating operation
    /// (write, set_len or sync_data, through any handle): that operation and every later one
    /// through a handle from before it fail, as if the machine stopped there, e.g. in the middle
    /// of a commit.
    pub fn crash_after_operations(&self, count: u64, seed: u64) {
        lock(&self.disk).armed = Some((count, seed));
    }

    /// How many crashes the file has been through: a test tells from it whether an armed crash
    /// happened.
    pub fn crashes_count(&self) -> u64 {
        lock(&self.disk).epoch
    }

    /// Current length, synced or not.
    pub fn len(&self) -> u64 {
        lock(&self.disk).current.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The disk, if this handle is live.
    fn live(&self, operation: &str) -> io::Result<MutexGuard<'_, Disk>> {
        let disk = lock(&self.disk);
        if disk.epoch != self.epoch {
            return Err(io::Error::other(format!(
                "{operation} on a simulated block file after a power loss: this handle belongs to the machine that lost power"
            )));
        }
        Ok(disk)
    }

    /// The disk for a mutating operation: counts down an armed crash, and crashes when it is due.
    fn live_for_change(&self, operation: &str) -> io::Result<MutexGuard<'_, Disk>> {
        let mut disk = self.live(operation)?;
        match disk.armed {
            Some((0, seed)) => {
                disk.crash(seed);
                drop(disk);
                Err(io::Error::other(format!(
                    "{operation} on a simulated block file: the power went out"
                )))
            }
            Some((count, seed)) => {
                disk.armed = Some((count - 1, seed));
                Ok(disk)
            }
            None => Ok(disk),
        }
    }
}

impl Default for SimBlockFile {
    fn default() -> Self {
        Self::new()
    }
}

/// A clone is a live handle to the same file, even if `self` died in a crash.
impl Clone for SimBlockFile {
    fn clone(&self) -> Self {
        let epoch = lock(&self.disk).epoch;
        SimBlockFile {
            disk: Arc::clone(&self.disk),
            epoch,
        }
    }
}

impl fmt::Debug for SimBlockFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let disk = lock(&self.disk);
        f.debug_struct("SimBlockFile")
            .field("len", &disk.current.len())
            .field("synced_len", &disk.synced.len())
            .field("dirty_sectors", &disk.dirty.len())
            .field("crashes", &disk.epoch)
            .field("live", &(disk.epoch == self.epoch))
            .finish()
    }
}

fn out_of_range(operation: &str, offset: u64, bytes: usize, len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("{operation} {bytes} bytes at {offset} of a simulated block file of {len} bytes"),
    )
}

impl redb::StorageBackend for SimBlockFile {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.live("stat")?.current.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let disk = self.live("read")?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = start.saturating_add(out.len());
        if end > disk.current.len() {
            return Err(out_of_range("read", offset, out.len(), disk.current.len()));
        }
        out.copy_from_slice(&disk.current[start..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut disk = self.live_for_change("set length of")?;
        let new_len = usize::try_from(len)
            .map_err(|_| out_of_range("set length to", len, 0, disk.current.len()))?;
        let old_len = disk.current.len() as u64;
        // Both the sectors cut off and the ones added (zeros) differ from the synced content,
        // and so does the sector the new end falls in.
        disk.mark_dirty(old_len.min(len), old_len.max(len));
        disk.current.resize(new_len, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut disk = self.live_for_change("sync")?;
        let Disk {
            current,
            synced,
            dirty,
            ..
        } = &mut *disk;
        synced.resize(current.len(), 0);
        for &sector in dirty.iter() {
            let start = (sector * SECTOR_BYTES) as usize;
            if start >= current.len() {
                break;
            }
            let end = (start + SECTOR_BYTES as usize).min(current.len());
            synced[start..end].copy_from_slice(&current[start..end]);
        }
        dirty.clear();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut disk = self.live_for_change("write")?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = start.saturating_add(data.len());
        if end > disk.current.len() {
            return Err(out_of_range(
                "write",
                offset,
                data.len(),
                disk.current.len(),
            ));
        }
        disk.current[start..end].copy_from_slice(data);
        disk.mark_dirty(offset, offset + data.len() as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::StorageBackend;

    fn content(file: &SimBlockFile) -> Vec<u8> {
        let file = file.clone();
        let mut buf = vec![0u8; file.len() as usize];
        StorageBackend::read(&file, 0, &mut buf).unwrap();
        buf
    }

    #[test]
    fn a_crash_keeps_synced_sectors_and_old_or_new_content_of_changed_ones() {
        let mut outcomes = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let file = SimBlockFile::new();
            file.set_len(4 * SECTOR_BYTES).unwrap();
            file.write(0, &[1u8; 4 * SECTOR_BYTES as usize]).unwrap();
            file.sync_data().unwrap();
            // Sectors 1 and 2 change (2 only partly), the file grows by a sector.
            file.write(SECTOR_BYTES, &[2u8; SECTOR_BYTES as usize + 10])
                .unwrap();
            file.set_len(5 * SECTOR_BYTES).unwrap();
            file.crash(seed);
            let after = content(&file);
            assert!(
                after.len() as u64 == 4 * SECTOR_BYTES || after.len() as u64 == 5 * SECTOR_BYTES,
                "seed {seed}"
            );
            let sectors: Vec<&[u8]> = after.chunks(SECTOR_BYTES as usize).collect();
            assert!(sectors[0].iter().all(|&b| b == 1), "seed {seed}");
            assert!(sectors[3].iter().all(|&b| b == 1), "seed {seed}");
            let sector1_new = sectors[1].iter().all(|&b| b == 2);
            assert!(
                sector1_new || sectors[1].iter().all(|&b| b == 1),
                "seed {seed}: sector 1 torn"
            );
            let sector2_new = sectors[2][..10].iter().all(|&b| b == 2);
            assert!(
                sectors[2][10..].iter().all(|&b| b == 1)
                    && (sector2_new || sectors[2][..10].iter().all(|&b| b == 1)),
                "seed {seed}: sector 2 torn"
            );
            if let Some(grown) = sectors.get(4) {
                assert!(grown.iter().all(|&b| b == 0), "seed {seed}");
            }
            outcomes.insert((sector1_new, sector2_new, sectors.len()));
            // Replays from the seed.
            let again = SimBlockFile::new();
            again.set_len(4 * SECTOR_BYTES).unwrap();
            again.write(0, &[1u8; 4 * SECTOR_BYTES as usize]).unwrap();
            again.sync_data().unwrap();
            again
                .write(SECTOR_BYTES, &[2u8; SECTOR_BYTES as usize + 10])
                .unwrap();
            again.set_len(5 * SECTOR_BYTES).unwrap();
            again.crash(seed);
            assert_eq!(content(&again), after, "seed {seed}");
        }
        assert_eq!(outcomes.len(), 8, "{outcomes:?}");
    }

    #[test]
    fn synced_data_survives_and_a_shrink_may_be_lost() {
        for seed in 0..20 {
            let file = SimBlockFile::new();
            file.set_len(2 * SECTOR_BYTES).unwrap();
            file.write(3, b"abc").unwrap();
            file.sync_data().unwrap();
            file.set_len(SECTOR_BYTES).unwrap();
            file.crash(seed);
            let after = content(&file);
            assert_eq!(&after[3..6], b"abc", "seed {seed}");
            assert!(after.len() as u64 >= SECTOR_BYTES);
        }
    }

    #[test]
    fn handles_from_before_a_crash_are_dead_and_clones_after_it_live() {
        let file = SimBlockFile::new();
        let old = file.clone();
        old.set_len(10).unwrap();
        file.crash(0);
        assert!(old.write(0, b"x").is_err());
        assert!(StorageBackend::len(&old).is_err());
        let fresh = file.clone();
        fresh.set_len(20).unwrap();
        assert_eq!(StorageBackend::len(&fresh).unwrap(), 20);
        assert_eq!(file.crashes_count(), 1);
    }

    #[test]
    fn an_armed_crash_stops_the_machine_at_the_chosen_operation() {
        let file = SimBlockFile::new();
        let handle = file.clone();
        handle.set_len(SECTOR_BYTES).unwrap();
        handle.sync_data().unwrap();
        file.crash_after_operations(2, 7);
        handle.write(0, b"one").unwrap();
        handle.write(3, b"two").unwrap();
        assert!(handle.sync_data().is_err());
        assert!(handle.write(6, b"three").is_err());
        assert_eq!(file.crashes_count(), 1);
        assert_eq!(file.len(), SECTOR_BYTES);
    }
}
