//! The disk itself, as the floor under every durable write: an insert is a `pwrite` of the
//! size a journal record holding that one value takes (header, range header and value,
//! padded to 512-byte sectors) into a preallocated file, and a sync is an `fdatasync` of it.
//! Reads cost nothing. No store that flushes the device per durable write can beat it; a
//! group commit can, by sharing one flush among several writers.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{MapStore, Result};

/// The file's length: writes cycle through it.
const LEN: u64 = 64 << 20;

/// A preallocated file on the disk under test.
pub(crate) struct Device {
    file: File,
    next: AtomicU64,
}

impl Device {
    /// Creates and fills the file (so writes overwrite allocated blocks, as a preallocated
    /// journal's do).
    pub(crate) fn create(path: &Path) -> Result<Device> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        let zeros = vec![0u8; 1 << 20];
        for at in (0..LEN).step_by(zeros.len()) {
            file.write_all_at(&zeros, at)?;
        }
        file.sync_all()?;
        Ok(Device {
            file,
            next: AtomicU64::new(0),
        })
    }
}

/// The bytes a journal record holding one `value_len`-byte write takes.
fn record_len(value_len: usize) -> u64 {
    (64 + 16 + value_len as u64).div_ceil(512) * 512
}

impl MapStore for Device {
    fn get(&self, _key: u64) -> Result<Option<usize>> {
        Ok(None)
    }

    fn insert(&self, _key: u64, value: &[u8]) -> Result {
        let len = record_len(value.len());
        // ORDERING: only distinct positions matter.
        let at = self.next.fetch_add(len, Ordering::Relaxed) % (LEN - len);
        let at = at / 512 * 512;
        let mut record = vec![0u8; len as usize];
        record[..value.len()].copy_from_slice(value);
        self.file.write_all_at(&record, at)?;
        Ok(())
    }

    fn remove(&self, _key: u64) -> Result {
        Ok(())
    }

    fn sync(&self) -> Result {
        self.file.sync_data()?;
        Ok(())
    }

    fn insert_batch(&self, _keys: &[u64], _value_size: usize) -> Result {
        Ok(())
    }
}
