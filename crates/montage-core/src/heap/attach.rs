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
        Files::Real { heap, .. } => existing_journal(heap, &jpath, true)?,
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
        (named, existing, header) => {
            let journal = named_journal(&jpath, named, existing, header, creation_id)?;
            let media = Media::new(region, Backend::Journal(Box::new(journal)));
            let replayed = replay(&media, media.journal(), &jpath)?;
            // PERSIST: before the records are folded, the heap file holds them durably.
            media.fence()?;
            if let Some(journal) = media.journal() {
                journal.fold()?;
            }
            Ok(Opened {
                media,
                replayed: Some(replayed),
            })
        }
    }
}

/// The journal file at `jpath` beside the heap file `heap`, opened for writing too if
/// `write`; `None` if there is none.
fn existing_journal(heap: &File, jpath: &Path, write: bool) -> Result<Option<Device>> {
    match OpenOptions::new().read(true).write(write).open(jpath) {
        Ok(journal) => {
            let len = journal
                .metadata()
                .map_err(|e| Error::io("stat", jpath, e))?
                .len();
            let data = heap.try_clone().map_err(|e| Error::io("dup", jpath, e))?;
            Ok(Some(Device::File { journal, data, len }))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("open", jpath, e)),
    }
}

/// Checks that the journal the heap file `heap` (at `path`, with `creation_id`) names as
/// `named` can be replayed: it is there, its header is intact, it is that heap's, and its
/// records are whole up to the last valid one. Reads only.
pub(super) fn check_journal(heap: &File, path: &Path, named: u64, creation_id: u64) -> Result<()> {
    let jpath = journal_path(path);
    let journal = read_journal(heap, &jpath, named, creation_id)?;
    replay_ranges(&journal, &jpath, |_, _| Ok(())).map(drop)
}

/// The journal at `jpath` that the heap file `heap` (with `creation_id`) names as `named`,
/// opened for reading only and checked as [`named_journal`] does.
fn read_journal(heap: &File, jpath: &Path, named: u64, creation_id: u64) -> Result<Journal> {
    let device = existing_journal(heap, jpath, false)?;
    let header = match &device {
        Some(device) => Journal::read_header(device)?,
        None => None,
    };
    named_journal(jpath, named, device, header, creation_id)
}

/// The journal a heap names as `named` (not 0), on `device` (`None`: no file) whose newest
/// header is `header`, checked to be the one the heap with `creation_id` names.
fn named_journal(
    jpath: &Path,
    named: u64,
    device: Option<Device>,
    header: Option<(usize, Header)>,
    creation_id: u64,
) -> Result<Journal> {
    let refuse = |what| {
        Err(Error::Journal {
            path: jpath.to_path_buf(),
            what,
        })
    };
    let Some(device) = device else {
        return refuse("the heap names a journal and it is missing");
    };
    let Some((slot, header)) = header else {
        return refuse("its header is damaged");
    };
    if header.creation_id != creation_id {
        return refuse("it belongs to another heap");
    }
    if header.journal_id != named {
        return refuse("it is not the journal this heap names");
    }
    Journal::new(device, header, slot).or_else(|_| refuse("it is too short"))
}

/// Replays `journal`'s records into the heap `media` maps, and sets the epoch word to the
/// journal's. The caller makes the result durable (or, read-only, keeps it in memory).
fn replay(media: &Media, journal: Option<&Journal>, jpath: &Path) -> Result<Replayed> {
    let journal = journal.ok_or(Error::InvalidConfig {
        what: "replay needs the journal",
    })?;
    let replayed = replay_ranges(journal, jpath, |offset, bytes| media.write(offset, bytes))?;
    // The durable epoch is the journal's, whatever the heap file's word reached early.
    media.store(EPOCH_OFFSET, replayed.word)?;
    Ok(replayed)
}

/// Hands every range of `journal`'s valid records to `apply`, in order; damage in the
/// records is [`Error::Journal`].
fn replay_ranges(
    journal: &Journal,
    jpath: &Path,
    apply: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<Replayed> {
    journal.replay(apply).map_err(|e| match e {
        Error::Corrupted { what, .. } => Error::Journal {
            path: jpath.to_path_buf(),
            what,
        },
        other => other,
    })
}

/// For a heap opened read-only: if it names a journal, replays it into `media`, a private
/// mapping of the heap file, writing neither file. Checks the journal as [`open`] does.
pub(super) fn replay_privately(
    heap: &File,
    path: &Path,
    media: &Media,
    creation_id: u64,
) -> Result<Option<Replayed>> {
    let named = superblock_word(media.region(), JOURNAL_ID_OFFSET)?;
    if named == 0 {
        return Ok(None);
    }
    let jpath = journal_path(path);
    let journal = read_journal(heap, &jpath, named, creation_id)?;
    replay(media, Some(&journal), &jpath).map(Some)
}

/// Whether the heap mapped in `region` names a journal.
pub(super) fn names_journal(region: &Region) -> Result<bool> {
    Ok(superblock_word(region, JOURNAL_ID_OFFSET)? != 0)
}

/// For a heap opened on another backend, once it recovered on the journal it names
/// ([`open`]): un-names the journal durably and removes its file. Hands the region back for
/// the other backend.
pub(super) fn detach(media: Media, path: &Path) -> Result<Region> {
    media.store(JOURNAL_ID_OFFSET, 0)?;
    // PERSIST: the heap no longer names the journal before the file goes.
    media.persist(JOURNAL_ID_OFFSET, 8)?;
    let jpath = journal_path(path);
    std::fs::remove_file(&jpath).map_err(|e| Error::io("remove", &jpath, e))?;
    Ok(media.into_region())
}
