//! Where the journal's bytes go: the real journal and data files, or the power-failure
//! simulator's model of them.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
#[cfg(any(test, feature = "sim"))]
use std::sync::Arc;

#[cfg(any(test, feature = "sim"))]
use crate::persist::sim::Simulator;

/// The journal file and the data file's durability, behind one interface.
#[derive(Debug)]
pub(crate) enum Device {
    /// Real files: `pwrite` and `fdatasync`.
    File {
        journal: File,
        /// The heap file (a duplicate of the heap's descriptor), for checkpoints.
        data: File,
        len: u64,
    },
    /// The simulator's page-cache model of both files.
    #[cfg(any(test, feature = "sim"))]
    Sim(Arc<Simulator>),
}

impl Device {
    /// The journal's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Device::File { len, .. } => *len,
            #[cfg(any(test, feature = "sim"))]
            Device::Sim(sim) => sim.journal_len(),
        }
    }

    /// Writes `bytes` at `offset` of the journal (into the page cache: not durable yet).
    pub(crate) fn write(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        match self {
            Device::File { journal, .. } => journal.write_all_at(bytes, offset),
            #[cfg(any(test, feature = "sim"))]
            Device::Sim(sim) => sim.journal_write(offset, bytes),
        }
    }

    /// Reads `buf.len()` bytes at `offset` of the journal.
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self {
            Device::File { journal, .. } => journal.read_exact_at(buf, offset),
            #[cfg(any(test, feature = "sim"))]
            Device::Sim(sim) => sim.journal_read(offset, buf),
        }
    }

    /// `fdatasync` of the journal: every write before it is durable.
    pub(crate) fn sync(&self) -> io::Result<()> {
        match self {
            Device::File { journal, .. } => journal.sync_data(),
            #[cfg(any(test, feature = "sim"))]
            Device::Sim(sim) => {
                sim.journal_sync();
                Ok(())
            }
        }
    }

    /// `fdatasync` of the heap file: every store into its mapping so far is durable.
    pub(crate) fn sync_data(&self) -> io::Result<()> {
        match self {
            Device::File { data, .. } => data.sync_data(),
            #[cfg(any(test, feature = "sim"))]
            Device::Sim(sim) => {
                sim.data_sync();
                Ok(())
            }
        }
    }
}
