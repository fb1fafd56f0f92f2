//! The journal beside a heap file: creating it, checking that it belongs to the heap,
//! replaying it at open, and removing it when the heap is opened on another backend.
//!
//! The heap's superblock names its journal by id (0: none). The id is durable in the heap
//! file before the first record is written, and zero again (durably) before the journal file
//! is removed, so a heap that names a journal never loses it unnoticed: opening such a heap
//! without its journal, or with another heap's, is [`Error::Journal`], and changes nothing.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
#[cfg(any(test, feature = "sim"))]
use std::sync::Arc;

use crate::base::layout::{EPOCH_OFFSET, JOURNAL_ID_OFFSET};
use crate::base::region::Region;
use crate::error::{Error, Result};
use crate::persist::journal::Journal;
pub(super) use crate::persist::journal::Replayed;
use crate::persist::journal::device::Device;
use crate::persist::journal::format::Header;
#[cfg(any(test, feature = "sim"))]
use crate::persist::sim::Simulator;
use crate::persist::{Backend, Media};

/// The journal file of the heap file at `heap`: `<heap>.journal`.
pub(crate) fn journal_path(heap: &Path) -> PathBuf {
    let mut name = heap.as_os_str().to_owned();
    name.push(".journal");
    PathBuf::from(name)
}

/// Where a journal's bytes are.
pub(super) enum Files<'a> {
    /// Real files: the heap file (open, locked) and its path.
    Real { heap: &'a File, path: &'a Path },
    /// The simulator, holding the journal image (if any) it started from.
    #[cfg(any(test, feature = "sim"))]
    Sim(Arc<Simulator>),
}

impl Files<'_> {
    fn journal_path(&self) -> PathBuf {
        match self {
            Files::Real { path, .. } => journal_path(path),
            #[cfg(any(test, feature = "sim"))]
            Files::Sim(_) => PathBuf::from("<simulated journal>"),
        }
    }
}

/// What [`open`] did to the journal.
pub(super) struct Opened {
    pub(super) media: Media,
    /// What replay found (`None` for a new journal).
    pub(super) replayed: Option<Replayed>,
}

/// The superblock word at `offset` (the journal id, the epoch word), read before a `Media`
/// exists.
fn superblock_word(region: &Region, offset: u64) -> Result<u64> {
    // ORDERING: read by the opening thread before the heap is shared.
    Ok(u64::from_le(
        region
            .word(offset)?
            .load(std::sync::atomic::Ordering::Acquire),
    ))
}

fn random_journal_id() -> u64 {
    crate::random::random_u64() | 1
}

/// Creates and formats a new journal of `len` bytes; fails if a file is in the way.
pub(super) fn create(
    files: &Files<'_>,
    creation_id: u64,
    len: u64,
    word: u64,
) -> Result<(Device, Header)> {
    let device = match files {
        Files::Real { heap, path } => {
            let jpath = journal_path(path);
            let journal = match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&jpath)
            {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(Error::Journal {
                        path: jpath,
                        what: "a file is in the way of the new heap's journal",
                    });
                }
                Err(e) => return Err(Error::io("create", &jpath, e)),
            };
            allocate(&journal, len).map_err(|e| Error::io("write", &jpath, e))?;
            // The new name is durable before the heap names the journal.
            if let Some(dir) = jpath.parent().filter(|d| !d.as_os_str().is_empty()) {
                File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| Error::io("fsync", dir, e))?;
            }
            Device::File {
                journal,
                data: heap.try_clone().map_err(|e| Error::io("dup", &jpath, e))?,
                len,
            }
        }
        #[cfg(any(test, feature = "sim"))]
        Files::Sim(sim) => Device::Sim(sim.clone()),
    };
    let header = Journal::format(&device, creation_id, random_journal_id(), word)?;
    Ok((device, header))
}

/// Writes the whole journal once, so that a full disk is found now and not in the middle
/// of a commit, and so that records later overwrite allocated, initialized blocks: an
/// `fdatasync` then flushes data only, with no file-system metadata to commit (a sparse
/// or `fallocate`d file would need an extent update on each first write).
fn allocate(file: &File, len: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK as usize];
    let mut at = 0;
    while at < len {
        let n = CHUNK.min(len - at);
        file.write_all_at(&zeros[..n as usize], at)?;
        at += n;
    }
    file.sync_all()
}

/// Opens the journal of a heap whose bytes are mapped in `region`, replays it into the
/// heap and folds it, or creates one if the heap names none. The journal is returned not
/// yet logging: recovery runs with fences that flush the heap file itself.
pub(super) fn open(
    files: &Files<'_>,
    region: Region,
    creation_id: u64,
    len: u64,
) -> Result<Opened> {
    let named = superblock_word(&region, JOURNAL_ID_OFFSET)?;
    let jpath = files.journal_path();
    let existing = match files {
        Files::Real { heap, path } => {
            match OpenOptions::new()
                .read(true)
                .write(true)
                .open(journal_path(path))
            {
                Ok(journal) => {
                    let len = journal
                        .metadata()
                        .map_err(|e| Error::io("stat", &jpath, e))?
                        .len();
                    let data = heap.try_clone().map_err(|e| Error::io("dup", &jpath, e))?;
                    Some(Device::File { journal, data, len })
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(Error::io("open", &jpath, e)),
            }
        }
        #[cfg(any(test, feature = "sim"))]
        Files::Sim(sim) => (sim.journal_len() > 0).then(|| Device::Sim(sim.clone())),
    };
    let header = match &existing {
        Some(device) => Journal::read_header(device)?,
        None => None,
    };
    match (named, existing, header) {
        (0, existing, header) => {
            // The heap names no journal: a leftover of an interrupted create or removal may
            // be reused, but not another heap's.
            if header.is_some_and(|(_, h)| h.creation_id != creation_id) {
                return Err(Error::Journal {
                    path: jpath,
                    what: "it belongs to another heap",
                });
            }
            let (device, header) = match existing {
                Some(device) => {
                    let word = superblock_word(&region, EPOCH_OFFSET)?;
                    let header = Journal::format(&device, creation_id, random_journal_id(), word)?;
                    (device, header)
                }
                None => create(
                    files,
                    creation_id,
                    len,
                    superblock_word(&region, EPOCH_OFFSET)?,
                )?,
            };
            let media = Media::new(
                region,
                Backend::Journal(Box::new(Journal::new(device, header, 0)?)),
            );
            media.store(JOURNAL_ID_OFFSET, header.journal_id)?;
            // PERSIST: the heap names its journal durably before any record is written.
            media.persist(JOURNAL_ID_OFFSET, 8)?;
            Ok(Opened {
                media,
                replayed: None,
            })
        }
        (_, None, _) => Err(Error::Journal {
            path: jpath,
            what: "the heap names a journal and it is missing",
        }),
        (_, Some(_), None) => Err(Error::Journal {
            path: jpath,
            what: "its header is damaged",
        }),
        (named, Some(device), Some((slot, header))) => {
            if header.creation_id != creation_id {
                return Err(Error::Journal {
                    path: jpath,
                    what: "it belongs to another heap",
                });
            }
            if header.journal_id != named {
                return Err(Error::Journal {
                    path: jpath,
                    what: "it is not the journal this heap names",
                });
            }
            let journal = Journal::new(device, header, slot).map_err(|_| Error::Journal {
                path: jpath.clone(),
                what: "it is too short",
            })?;
            let media = Media::new(region, Backend::Journal(Box::new(journal)));
            let replayed = replay(&media, &jpath)?;
            Ok(Opened {
                media,
                replayed: Some(replayed),
            })
        }
    }
}

/// Replays the journal into the heap, makes the heap file durable and folds the records.
fn replay(media: &Media, jpath: &Path) -> Result<Replayed> {
    let journal = media.journal().ok_or(Error::InvalidConfig {
        what: "replay needs the journal backend",
    })?;
    let damaged = |e: Error| match e {
        Error::Corrupted { what, .. } => Error::Journal {
            path: jpath.to_path_buf(),
            what,
        },
        other => other,
    };
    let replayed = journal
        .replay(|offset, bytes| media.write(offset, bytes))
        .map_err(damaged)?;
    // The durable epoch is the journal's, whatever the heap file's word reached early.
    media.store(EPOCH_OFFSET, replayed.word)?;
    // PERSIST: before the records are folded, the heap file holds them durably.
    media.fence()?;
    journal.fold()?;
    Ok(replayed)
}

/// For a heap opened on another backend: if it names a journal, replays it, makes the heap
/// file durable, un-names it and removes the file. Runs before recovery; hands the region
/// back for the other backend.
pub(super) fn detach(heap: &File, path: &Path, region: Region, creation_id: u64) -> Result<Region> {
    if superblock_word(&region, JOURNAL_ID_OFFSET)? == 0 {
        return Ok(region);
    }
    let media = open(&Files::Real { heap, path }, region, creation_id, 0)?.media;
    media.store(JOURNAL_ID_OFFSET, 0)?;
    // PERSIST: the heap no longer names the journal before the file goes.
    media.persist(JOURNAL_ID_OFFSET, 8)?;
    let jpath = journal_path(path);
    std::fs::remove_file(&jpath).map_err(|e| Error::io("remove", &jpath, e))?;
    Ok(media.into_region())
}
