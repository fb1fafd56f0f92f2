//! Creating, formatting and opening heaps: the file, its lock and mapping, the superblock,
//! and the recovery every open runs before the heap is handed out.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;

use zerocopy::IntoBytes;

use super::attach::{self, Files};
use super::directory::read_directory;
use super::repair;
use super::{Heap, Shared};
use crate::alloc::block::BlockView;
use crate::alloc::{Allocator, FreeState};
use crate::base::epoch::Epoch;
use crate::base::layout::{
    CLEAN_SHUTDOWN_OFFSET, DIRECTORY, DIRECTORY_CAPACITY, EPOCH_OFFSET, Geometry,
    JOURNAL_ID_OFFSET, MAGIC_OFFSET, MAX_HEAP_SIZE, SPAN_COUNT_OFFSET, SPAN_SIZE,
    SUPERBLOCK_HEAD_LEN, decode_span_count, span_count_word,
};
use crate::base::mapping::{Mapping, free_space};
use crate::base::region::Region;
use crate::config::{BackendKind, HeapConfig, Location};
use crate::epoch::{Epochs, Runtime};
use crate::error::{Error, Result};
use crate::meta::registry::Registry;
use crate::persist::journal::Journal;
use crate::persist::pages::Pages;
#[cfg(any(test, feature = "sim"))]
use crate::persist::sim::CrashImage;
use crate::persist::{Backend, Media, allocate_file};
use crate::recovery::{self, RecoveryReport, Verdict};

/// How recovery decides which blocks live.
#[derive(Clone, Copy)]
pub(super) enum Policy<'a> {
    /// The epoch rule (DESIGN.md section 5).
    Epochs,
    /// The caller's decision.
    Custom(&'a (dyn Fn(&BlockView<'_>) -> Verdict + Sync)),
}

/// Where an opened heap's bytes came from.
enum Source<'a> {
    File(&'a Path),
    #[cfg(any(test, feature = "sim"))]
    Image(Pages, Option<Pages>),
}

impl Heap {
    /// Creates a new heap as `config` describes. A file heap is created at the configured
    /// path, which must not exist yet.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyExists`] if the file exists (it is left untouched), [`Error::BadSize`]
    /// for a size that cannot hold a heap, [`Error::NoDiskSpace`] if its file system cannot
    /// hold it (the file is removed again), [`Error::Io`] if the file cannot be created or
    /// sized, [`Error::InvalidConfig`] for an inconsistent configuration.
    pub fn create(config: &HeapConfig) -> Result<Heap> {
        config.validate()?;
        if config.read_only {
            return Err(Error::InvalidConfig {
                what: "a heap cannot be created read-only",
            });
        }
        if config.max_size.is_some_and(|max| max < config.size) {
            return Err(Error::InvalidConfig {
                what: "max_size is smaller than the size to create the heap with",
            });
        }
        let creation_id = crate::random::random_u64();
        let geometry = Geometry::for_new(config.size, creation_id)?;
        let len = usize::try_from(geometry.heap_size).map_err(|_| Error::BadSize {
            size: geometry.heap_size,
            why: "larger than the address space",
        })?;
        let (mapping, file) = match &config.location {
            Location::File(path) => {
                let (mapping, file) = create_file(config, path, &geometry, len)?;
                (mapping, Some((file, path.clone())))
            }
            Location::Memory => (map_memory(config, &geometry, len)?, None),
        };
        let region = Region::with_len(mapping, len);
        let media = if let Some(files) =
            journal_files(config, file.as_ref(), || Pages::zeroed(len), None)
        {
            let made = attach::create(&files, creation_id, config.journal_len(), 1)
                .and_then(|(device, header)| Journal::new(device, header, 0));
            let journal = match made {
                Ok(journal) => journal,
                Err(err) => {
                    if let Some((_, path)) = &file {
                        // We made this file a moment ago and it holds nothing yet.
                        let _ = std::fs::remove_file(path);
                    }
                    return Err(err);
                }
            };
            let id = journal.id();
            let media = Media::new(region, Backend::Journal(Box::new(journal)));
            format(&media, &geometry, id)?;
            media
        } else {
            let media = Media::new(region, Backend::new(config, || Pages::zeroed(len))?);
            format(&media, &geometry, 0)?;
            media
        };
        let media = media.with_file(file.as_ref())?;
        let limit = spans_within(&geometry, media.region().reserved() as u64);
        if let Some(journal) = media.journal() {
            journal.start_logging();
        }
        let free = FreeState {
            free_spans: (0..geometry.span_count).collect(),
            ..FreeState::new(geometry.span_count)
        };
        let shared = Shared {
            runtime: Runtime {
                alloc: Allocator::new(geometry, limit, free)?,
                epochs: Epochs::new(Epoch::FIRST, 1, config.thread_slots, config.epoch_length),
                media,
                types: Registry::empty(creation_id),
                write_back: config.write_back,
                directory: Mutex::new(vec![None; DIRECTORY_CAPACITY]),
                verify_reads: config.verify_reads,
                read_only: false,
            },
            geometry,
            attached: Mutex::new(0),
            report: RecoveryReport {
                clean_shutdown: true,
                ..RecoveryReport::default()
            },
            backend: config.backend,
            file,
        };
        let heap = Heap::start(shared)?;
        let runtime = &heap.shared().runtime;
        runtime.alloc.fill_reserve(&runtime.media)?;
        Ok(heap)
    }

    /// Opens an existing heap file and recovers it: with `w` the stored epoch word, keeps
    /// the blocks of epochs `<= w - 2`, the newest version of each uid, none whose newest
    /// version is an anti-block, and durably invalidates everything else before returning.
    /// Each named structure then finds its payloads with [`scan`](Self::scan).
    ///
    /// # Errors
    ///
    /// [`Error::Locked`] if the heap is open elsewhere; [`Error::BadMagic`],
    /// [`Error::FormatVersion`], [`Error::Truncated`] or [`Error::Corrupted`] if the file is
    /// not a heap this build can read (the file is left untouched); [`Error::Io`] if it
    /// cannot be opened or mapped.
    pub fn open(config: &HeapConfig) -> Result<Heap> {
        Self::open_file(config, Policy::Epochs)
    }

    /// The journal file of the heap file at `path`: `<path>.journal`, beside it. A heap on
    /// the journal backend is these two files; copy, move or back them up together.
    pub fn journal_path(path: impl AsRef<Path>) -> std::path::PathBuf {
        attach::journal_path(path.as_ref())
    }

    /// Deletes the heap file at `path` and the journal beside it (`<path>.journal`), if
    /// they exist. Use it rather than deleting the heap file alone: a journal left behind
    /// is in the way of the next heap created at `path` ([`Error::Journal`]).
    ///
    /// # Errors
    ///
    /// [`Error::Locked`] while the heap is open, in this process or another (both files are
    /// left); [`Error::Io`] if a file cannot be removed.
    pub fn remove(path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let journal = attach::journal_path(path);
        match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => {
                lock_file(&file, path)?;
                std::fs::remove_file(path).map_err(|e| Error::io("remove", path, e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("open", path, e)),
        }
        match std::fs::remove_file(&journal) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove", &journal, e)),
        }
    }

    pub(super) fn open_file(config: &HeapConfig, policy: Policy<'_>) -> Result<Heap> {
        config.validate()?;
        match &config.location {
            Location::File(path) => Self::open_source(config, Source::File(path), policy),
            Location::Memory => Err(Error::InvalidConfig {
                what: "an in-memory heap cannot be opened; use open_image",
            }),
        }
    }

    #[cfg(any(test, feature = "sim"))]
    /// Opens a heap from a crash image (or any saved heap bytes) into memory, on the
    /// configured in-memory backend (usually the simulator, so recovery can itself be
    /// crashed), and recovers it as [`open`](Self::open) does.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open), for the image's contents.
    pub fn open_image(image: CrashImage, config: &HeapConfig) -> Result<Heap> {
        Self::open_image_policy(image, config, Policy::Epochs)
    }

    #[cfg(any(test, feature = "sim"))]
    pub(super) fn open_image_policy(
        image: CrashImage,
        config: &HeapConfig,
        policy: Policy<'_>,
    ) -> Result<Heap> {
        config.validate()?;
        if config.location != Location::Memory {
            return Err(Error::InvalidConfig {
                what: "open_image needs an in-memory configuration",
            });
        }
        let (bytes, journal) = image.into_parts();
        Self::open_source(config, Source::Image(bytes, journal), policy)
    }

    // Without the simulator `Source` holds only a path, which is not consumed.
    #[cfg_attr(not(any(test, feature = "sim")), allow(clippy::needless_pass_by_value))]
    fn open_source(config: &HeapConfig, source: Source<'_>, policy: Policy<'_>) -> Result<Heap> {
        let mut repairs = Vec::new();
        let (geometry, mapping, file, initial) = map_source(config, source, &mut repairs)?;
        let (mapping, file_len) = mapping;
        let region = Region::with_len(mapping, file_len);
        let (initial, journal_image) = load_image(&region, initial)?;
        let (media, replayed) = open_media(
            config,
            file.as_ref(),
            &geometry,
            region,
            initial,
            journal_image,
        )?;
        // PERSIST: INV-REC-1: recovery decides on the durable image, so whatever a crashed
        // process left dirty is written back before it is read.
        media.settle_before_recovery(geometry.data_offset)?;
        // On a heap that had a journal the file's pages may be ahead of the journal's word.
        let word_leads = replayed.is_none() && media.journal().is_none();
        let geometry = with_span_count(&media, &geometry)?;
        for span in (0..geometry.span_count).filter(|&span| geometry.is_table_span(span)) {
            // PERSIST: INV-REC-1: a grown heap's group tables, like the first table.
            media.settle_range(geometry.span_start(span), SPAN_SIZE)?;
        }
        if config.repair {
            repair::fix_tables(&media, &geometry, &mut repairs)?;
        }
        let (stored, mut directory, types) = read_metadata(&media, &geometry, word_leads)?;
        let recovered = recover_adopting(
            config,
            &media,
            &geometry,
            policy,
            (stored, &mut directory),
            &mut repairs,
        )?;
        let media = match (&file, config.backend) {
            // A journal heap opened on another backend recovered on its journal (so no
            // block newer than the epoch word is left behind by a crash in recovery); it
            // goes now.
            (Some((_, path)), backend)
                if backend != BackendKind::Journal && !config.read_only && replayed.is_some() =>
            {
                let region = attach::detach(media, path)?;
                Media::new(region, Backend::new(config, Pages::default)?)
            }
            _ => media,
        };
        // A heap opened read-only never lengthens its file.
        let media = media.with_file(file.as_ref().filter(|_| !config.read_only))?;
        let limit = spans_within(&geometry, media.region().reserved() as u64);
        let recovery::Recovered {
            free,
            mut report,
            max_uid,
            antis,
            ..
        } = recovered;
        // `check_header` bounds every uid, so this cannot overflow.
        let next_uid = max_uid.saturating_add(1);
        report.clean_shutdown = stored.clean;
        report.repairs = repairs;
        media.store(CLEAN_SHUTDOWN_OFFSET, 0)?;
        // PERSIST: the heap is marked open (not cleanly shut down) before it is used.
        media.persist(CLEAN_SHUTDOWN_OFFSET, 8)?;
        if let Some(journal) = media.journal() {
            journal.start_logging();
        }
        if let Some(replayed) = replayed {
            report.journal_records = replayed.records;
            report.journal_bytes = replayed.bytes;
        }
        let shared = Shared {
            runtime: Runtime {
                alloc: Allocator::new(geometry, limit, free)?,
                epochs: Epochs::new(
                    stored.word,
                    next_uid,
                    config.thread_slots,
                    config.epoch_length,
                ),
                media,
                types,
                write_back: config.write_back,
                directory: Mutex::new(directory),
                verify_reads: config.verify_reads,
                read_only: config.read_only,
            },
            geometry,
            attached: Mutex::new(0),
            report,
            backend: config.backend,
            file,
        };
        let heap = Heap::start(shared)?;
        // The anti-blocks recovery kept shadow versions it has durably invalidated; they can
        // go now (INV-EP-3), in a fence of their own after the one that covered the victims.
        let runtime = &heap.shared().runtime;
        runtime.alloc.release(&runtime.media, &antis)?;
        runtime.alloc.fill_reserve(&runtime.media)?;
        Ok(heap)
    }
}

/// What [`map_source`] returns.
type Mapped = (
    Geometry,
    (Mapping, usize),
    Option<(File, std::path::PathBuf)>,
    Option<Image>,
);

/// The opened heap's geometry as its superblock states it, its mapping and length, its file
/// (for a file heap) and the image it starts from (for an image).
#[cfg_attr(not(any(test, feature = "sim")), allow(clippy::needless_pass_by_value))]
fn map_source(
    config: &HeapConfig,
    source: Source<'_>,
    repairs: &mut Vec<recovery::Repair>,
) -> Result<Mapped> {
    Ok(match source {
        Source::File(path) => {
            let (geometry, mapping, len, file) = open_file(config, path, repairs)?;
            (
                geometry,
                (mapping, len),
                Some((file, path.to_path_buf())),
                None,
            )
        }
        #[cfg(any(test, feature = "sim"))]
        Source::Image(bytes, journal) => {
            let mut head = vec![0u8; (SUPERBLOCK_HEAD_LEN as usize).min(bytes.len())];
            bytes.read(0, &mut head);
            let geometry = Geometry::from_superblock(&head, bytes.len() as u64)?;
            let mapping = map_memory(config, &geometry, bytes.len())?;
            (
                geometry,
                (mapping, bytes.len()),
                None,
                Some((bytes, journal)),
            )
        }
    })
}

/// Runs [`recover`]; when repairing, gives the payloads of an owner the directory does not
/// list a name first (updating `directory`), as often as recovery finds such an owner.
fn recover_adopting(
    config: &HeapConfig,
    media: &Media,
    geometry: &Geometry,
    policy: Policy<'_>,
    (mut stored, directory): (recovery::Stored, &mut [Option<String>]),
    repairs: &mut Vec<recovery::Repair>,
) -> Result<recovery::Recovered> {
    loop {
        match recover(config, media, geometry, policy, stored, directory) {
            Err(Error::Corrupted { offset, what })
                if config.repair && what == recovery::ORPHANS =>
            {
                let index = DIRECTORY.index_of(offset);
                let taken: Vec<String> = directory.iter().flatten().cloned().collect();
                directory[index] = Some(repair::adopt(media, geometry, index, &taken, repairs)?);
                stored.owners |= 1 << (index + 1);
            }
            result => return result,
        }
    }
}

/// Runs recovery on an opened heap's media, with `policy` and the options `config` sets.
fn recover(
    config: &HeapConfig,
    media: &Media,
    geometry: &Geometry,
    policy: Policy<'_>,
    stored: recovery::Stored,
    directory: &[Option<String>],
) -> Result<recovery::Recovered> {
    let options = recovery::Options {
        threads: config.recovery_threads,
        progress: config.progress.as_ref().map(|p| &*p.0),
        quarantine: config.quarantine,
        repair: config.repair,
    };
    match policy {
        Policy::Epochs => recovery::recover_epochs(media, geometry, options, stored, directory),
        Policy::Custom(decide) => {
            recovery::recover(media, geometry, options, decide, !stored.word_leads)
        }
    }
}

/// The geometry of a heap being opened with the spans its span count word names.
fn with_span_count(media: &Media, geometry: &Geometry) -> Result<Geometry> {
    if !geometry.grows() {
        return Ok(*geometry);
    }
    let word = media.load(SPAN_COUNT_OFFSET)?;
    let count = decode_span_count(word, geometry.creation_id).ok_or(Error::Corrupted {
        offset: SPAN_COUNT_OFFSET,
        what: "the span count word fails its check",
    })?;
    geometry.with_span_count(count, media.region().len() as u64)
}

/// What the superblock's mutable words, the directory and the type registry of a heap being
/// opened say, checked before recovery writes anything: a damaged heap is refused unchanged.
fn read_metadata(
    media: &Media,
    geometry: &Geometry,
    word_leads: bool,
) -> Result<(recovery::Stored, Vec<Option<String>>, Registry)> {
    let clean = match media.load(CLEAN_SHUTDOWN_OFFSET)? {
        0 => false,
        1 => true,
        _ => {
            return Err(Error::Corrupted {
                offset: CLEAN_SHUTDOWN_OFFSET,
                what: "the clean-shutdown flag is neither 0 nor 1",
            });
        }
    };
    let word = Epoch::new(media.load(EPOCH_OFFSET)?);
    if word < Epoch::FIRST || word > Epoch::LIMIT {
        return Err(Error::Corrupted {
            offset: EPOCH_OFFSET,
            what: "the epoch word is outside the epochs a clock reaches",
        });
    }
    let directory = read_directory(media, geometry)?;
    let types = Registry::load(media, geometry.creation_id)?;
    let owners = directory
        .iter()
        .enumerate()
        .filter(|(_, name)| name.is_some())
        .fold(1u128, |set, (index, _)| set | 1 << (index + 1));
    let stored = recovery::Stored {
        word,
        clean,
        word_leads,
        owners,
    };
    Ok((stored, directory, types))
}

/// Opens, locks and maps the heap file at `path` after checking its superblock; returns its
/// geometry as the superblock states it, the mapping (reserving what the heap may grow to)
/// and the file's length.
fn open_file(
    config: &HeapConfig,
    path: &Path,
    repairs: &mut Vec<recovery::Repair>,
) -> Result<(Geometry, Mapping, usize, File)> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(!config.read_only)
        .open(path)
        .map_err(|e| Error::io("open", path, e))?;
    if config.read_only {
        lock_file_shared(&file, path)?;
    } else {
        lock_file(&file, path)?;
    }
    if config.repair {
        repair::fix_file(&file, path, repairs)?;
    }
    let file_len = file
        .metadata()
        .map_err(|e| Error::io("stat", path, e))?
        .len();
    let mut head = Vec::with_capacity(SUPERBLOCK_HEAD_LEN as usize);
    (&mut file)
        .take(SUPERBLOCK_HEAD_LEN)
        .read_to_end(&mut head)
        .map_err(|e| Error::io("read", path, e))?;
    let geometry = Geometry::from_superblock(&head, file_len)?;
    let len = usize::try_from(file_len).map_err(|_| Error::BadSize {
        size: file_len,
        why: "larger than the address space",
    })?;
    let mapping = map_file(config, &geometry, &file, path, len)?;
    Ok((geometry, mapping, len, file))
}

/// Creates the heap file at `path` for a new heap of `geometry` (`len` bytes), allocates its
/// bytes, locks and maps it; on failure removes it again.
fn create_file(
    config: &HeapConfig,
    path: &Path,
    geometry: &Geometry,
    len: usize,
) -> Result<(Mapping, File)> {
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Error::AlreadyExists {
                path: path.to_path_buf(),
            });
        }
        Err(e) => return Err(Error::io("create", path, e)),
    };
    // The file's bytes are allocated on the disk, not left a sparse hole: a store through
    // the mapping into a hole on a full disk would be a SIGBUS, where this is an error.
    let made = lock_file(&file, path)
        .and_then(|()| allocate_file(&file, path, 0, geometry.heap_size))
        .and_then(|()| map_file(config, geometry, &file, path, len));
    match made {
        Ok(mapping) => Ok((mapping, file)),
        Err(err) => {
            // We made this file a moment ago and it holds nothing yet.
            drop(file);
            let _ = std::fs::remove_file(path);
            Err(err)
        }
    }
}

/// Maps the heap file `file` (at `path`, `len` bytes long now), reserving the address range
/// a heap with `geometry` may grow into as `config` allows.
fn map_file(
    config: &HeapConfig,
    geometry: &Geometry,
    file: &File,
    path: &Path,
    len: usize,
) -> Result<Mapping> {
    if config.read_only {
        return Mapping::private(file, len).map_err(|e| Error::io("mmap", path, e));
    }
    let limit = growth_limit(config, geometry, len as u64, Some(file));
    reserve(limit, len, |reserve| {
        Mapping::file(
            file,
            reserve,
            wants_map_sync(config.backend),
            config.huge_pages,
        )
    })
    .map_err(|e| Error::io("mmap", path, e))
}

/// Anonymous memory for a heap in memory with `geometry`, `len` bytes long now, reserving
/// the range it may grow into as `config` allows.
fn map_memory(config: &HeapConfig, geometry: &Geometry, len: usize) -> Result<Mapping> {
    let limit = growth_limit(config, geometry, len as u64, None);
    reserve(limit, len, |reserve| {
        Mapping::anonymous(reserve, config.huge_pages)
    })
    .map_err(|e| Error::io("mmap", Path::new("<memory>"), e))
}

/// How many bytes a heap with `geometry`, `len` bytes long now, may grow to as `config`
/// allows (see [`HeapConfig::max_size`]); `file` is the heap file.
fn growth_limit(config: &HeapConfig, geometry: &Geometry, len: u64, file: Option<&File>) -> u64 {
    if !geometry.grows() {
        return len;
    }
    let limit = match (config.max_size, file) {
        (Some(max), _) => max,
        // As far as the file system has room (unknown: no growth).
        (None, Some(file)) => len.saturating_add(free_space(file).unwrap_or(0)),
        (None, None) => config.size,
    };
    limit.clamp(len, MAX_HEAP_SIZE)
}

/// Maps `limit` bytes with `map`, or, where the address space will not take that many, the
/// most it takes down to `len`: the reservation a heap grows into.
fn reserve(
    limit: u64,
    len: usize,
    map: impl Fn(usize) -> std::io::Result<Mapping>,
) -> std::io::Result<Mapping> {
    let mut want = usize::try_from(limit).unwrap_or(usize::MAX).max(len);
    loop {
        match map(want) {
            Ok(mapping) => return Ok(mapping),
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && want > len => {
                want = (want / 2).max(len);
            }
            Err(e) => return Err(e),
        }
    }
}

/// How many spans fit in the first `bytes` of a heap with `geometry`.
fn spans_within(geometry: &Geometry, bytes: u64) -> u64 {
    bytes.saturating_sub(geometry.data_offset) / SPAN_SIZE
}

/// Loads a saved image into a fresh in-memory mapping (which is zero, so only the pages that
/// hold something are written) and returns the heap's and the journal's bytes. Not a store
/// the simulator should see: it is the durable state the simulator starts from.
fn load_image(region: &Region, image: Option<Image>) -> Result<Loaded> {
    match image {
        Some((bytes, journal)) => {
            for (offset, page) in bytes.present() {
                region.write(offset as u64, page)?;
            }
            Ok((Some(bytes), journal))
        }
        None => Ok((None, None)),
    }
}

/// A saved heap's bytes and its journal's, if it has one.
type Image = (Pages, Option<Pages>);

/// What [`load_image`] hands on: the heap's bytes and the journal's, when there was an image.
type Loaded = (Option<Pages>, Option<Pages>);

/// The media of a heap being opened: on the journal backend with its journal replayed and
/// folded (and what replay found). On another backend, a heap that names a journal is
/// opened on it all the same, replayed and folded, and recovers on it before the caller
/// detaches it ([`attach::detach`]). Read-only, the journal is replayed into the private
/// mapping.
fn open_media(
    config: &HeapConfig,
    file: Option<&(File, std::path::PathBuf)>,
    geometry: &Geometry,
    region: Region,
    initial: Option<Pages>,
    journal_image: Option<Pages>,
) -> Result<(Media, Option<attach::Replayed>)> {
    if config.read_only
        && let Some((file, path)) = file
    {
        let media = Media::new(region, Backend::Volatile);
        let replayed = attach::replay_privately(file, path, &media, geometry.creation_id)?;
        return Ok((media, replayed));
    }
    let mut initial = initial;
    // The simulator takes the image only on the file model; otherwise the backend below does.
    let files = journal_files(
        config,
        file,
        || initial.take().unwrap_or_default(),
        journal_image,
    );
    if let Some(files) = files {
        let opened = attach::open(&files, region, geometry.creation_id, config.journal_len())?;
        return Ok((opened.media, opened.replayed));
    }
    if let Some((heap, path)) = file
        && attach::names_journal(&region)?
    {
        let files = Files::Real { heap, path };
        let opened = attach::open(&files, region, geometry.creation_id, 0)?;
        return Ok((opened.media, opened.replayed));
    }
    let backend = Backend::new(config, || initial.unwrap_or_default())?;
    Ok((Media::new(region, backend), None))
}

/// Where the journal of a heap opened with `config` lives, if it has one: beside the heap
/// file, or in the simulator's file model (`initial` and `journal` are the images it starts
/// from).
#[cfg_attr(
    not(any(test, feature = "sim")),
    allow(unused_variables, clippy::needless_pass_by_value)
)]
fn journal_files<'a>(
    config: &HeapConfig,
    file: Option<&'a (File, std::path::PathBuf)>,
    initial: impl FnOnce() -> Pages,
    journal: Option<Pages>,
) -> Option<Files<'a>> {
    match (config.backend, file) {
        (BackendKind::Journal, Some((heap, path))) => Some(Files::Real { heap, path }),
        #[cfg(any(test, feature = "sim"))]
        (BackendKind::Simulated(crate::config::SimMode::File), None) => {
            let journal = journal.unwrap_or_else(|| Pages::zeroed(config.journal_len() as usize));
            let sim = crate::persist::sim::Simulator::new(
                crate::config::SimMode::File,
                initial(),
                Some(journal),
            );
            if let Some(step) = config.sim_crash_at {
                sim.crash_at(step);
            }
            Some(Files::Sim(std::sync::Arc::new(sim)))
        }
        _ => None,
    }
}

fn wants_map_sync(backend: BackendKind) -> bool {
    matches!(backend, BackendKind::Pmem | BackendKind::Eadr)
}

/// Takes the heap file's exclusive lock: one writer, and no reader while it writes.
fn lock_file(file: &File, path: &Path) -> Result<()> {
    locked(file.try_lock(), path)
}

/// Takes the heap file's shared lock, for a heap opened read-only.
fn lock_file_shared(file: &File, path: &Path) -> Result<()> {
    locked(file.try_lock_shared(), path)
}

fn locked(result: Result<(), std::fs::TryLockError>, path: &Path) -> Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Locked {
            path: path.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(Error::io("flock", path, e)),
    }
}

/// Writes a new heap's superblock. The magic goes last, so a crash while formatting leaves
/// a file that open rejects as "not a heap" rather than a half-made heap.
fn format(media: &Media, geometry: &Geometry, journal_id: u64) -> Result<()> {
    let head = geometry.superblock();
    let bytes = head.as_bytes();
    media.write(8, &bytes[8..])?;
    media.store(EPOCH_OFFSET, Epoch::FIRST.get())?;
    media.store(CLEAN_SHUTDOWN_OFFSET, 0)?;
    media.store(JOURNAL_ID_OFFSET, journal_id)?;
    media.store(
        SPAN_COUNT_OFFSET,
        span_count_word(geometry.span_count, geometry.creation_id),
    )?;
    // PERSIST: every superblock field is durable before the magic that makes it a heap.
    media.persist(0, geometry.data_offset)?;
    media.write(MAGIC_OFFSET, &bytes[..8])?;
    // PERSIST: the heap exists once the magic is durable.
    media.persist(MAGIC_OFFSET, 8)
}
