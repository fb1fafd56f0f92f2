//! `Heap`: create, open (with recovery), allocate, read, write, free, name structures, and
//! close. The one public entry point to a persistent heap.

pub(crate) mod layout;
#[allow(unsafe_code)]
pub(crate) mod mapping;
#[allow(unsafe_code)]
pub(crate) mod region;
pub(crate) mod table;

use crate::payload::registry::Registry;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use zerocopy::IntoBytes;

use crate::alloc::block::{BlockInfo, BlockSpec, OwnerId, PBlock};
use crate::alloc::{AllocStats, Allocator, FreeState};
use crate::config::{BackendKind, HeapConfig, Location, WriteBack};
use crate::epoch::{EpochLength, Epochs};
use crate::error::{Error, Result};
use crate::persist::sim::{CrashImage, Simulator};
use crate::persist::{Backend, Media};
use crate::recovery::scan::{self, UnitVisit};
use crate::recovery::{self, BlockView, RecoveryReport, Verdict};
use layout::{
    CLEAN_SHUTDOWN_OFFSET, DIR_OWNER_OFFSET, DIRECTORY, DIRECTORY_CAPACITY, ENTRY_VALID_OFFSET,
    EPOCH_OFFSET, Geometry, HEADER_LEN, LEN_WORD_OFFSET, MAGIC_OFFSET, NAME_MAX,
    SUPERBLOCK_HEAD_LEN,
};
use mapping::Mapping;
use region::Region;

/// The epoch a new heap starts in.
pub const INITIAL_EPOCH: u64 = 1;

/// Which blocks a [`Heap::scan`] visits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanFilter {
    /// Only blocks of this owner.
    pub owner: Option<OwnerId>,
    /// Only blocks of this type id.
    pub type_id: Option<u64>,
}

impl ScanFilter {
    /// Every valid block.
    pub fn all() -> ScanFilter {
        ScanFilter::default()
    }

    /// Only blocks of `owner`.
    #[must_use]
    pub fn owner(mut self, owner: OwnerId) -> ScanFilter {
        self.owner = Some(owner);
        self
    }

    /// Only blocks of `type_id`.
    #[must_use]
    pub fn type_id(mut self, type_id: u64) -> ScanFilter {
        self.type_id = Some(type_id);
        self
    }

    fn matches(&self, info: &BlockInfo) -> bool {
        self.owner.is_none_or(|o| o == info.spec.owner)
            && self.type_id.is_none_or(|t| t == info.spec.type_id)
    }
}

/// How recovery decides which blocks live.
#[derive(Clone, Copy)]
enum Policy<'a> {
    /// The epoch rule (DESIGN.md section 5).
    Epochs,
    /// The caller's decision.
    Custom(&'a (dyn Fn(&BlockView<'_>) -> Verdict + Sync)),
}

/// Where an opened heap's bytes came from.
enum Source<'a> {
    File(&'a Path),
    Image(Vec<u8>),
}

/// A persistent heap: a mapped file (or, for tests, memory) holding payload blocks.
///
/// A `Heap` is a handle: cloning it is cheap (a reference count) and every clone names the
/// same open heap, as a `sled::Db` or an `Arc` does. Structures keep a clone, so they are
/// `'static` and can move into threads and tasks. A heap is `Send + Sync`. It holds an
/// exclusive `flock` on its file while open: a second open, from this process or another,
/// fails with [`Error::Locked`].
///
/// # Closing
///
/// [`close`](Self::close) waits for running operations, makes everything they did durable,
/// and marks the heap cleanly shut down. Handles that outlive it (clones, structures) stay
/// memory-safe: from then on every operation, `sync`, advance, registration and raw write
/// through them fails with [`Error::Closed`], while reads still see the closed heap's
/// contents. The file stays mapped and locked until the last handle is dropped. Dropping the
/// last handle without `close` closes the heap the same way, ignoring errors (a heap whose
/// close failed recovers like after a crash).
///
/// ```
/// use montage_core::{Heap, HeapConfig, ScanFilter};
/// # let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("doc.heap");
/// let heap = Heap::create(&HeapConfig::new(&path).size(4 << 20))?;
/// let owner = heap.register("greetings")?;
/// heap.run_op(|op| op.alloc(owner, 0, b"hello"))?;
/// heap.sync()?; // durable from here on
/// heap.close()?;
///
/// let heap = Heap::open(&HeapConfig::new(&path))?;
/// let owner = heap.lookup("greetings").unwrap();
/// let found = heap.collect(ScanFilter::all().owner(owner))?;
/// assert_eq!(found.len(), 1);
/// assert_eq!(heap.read_payload(found[0].block)?, b"hello");
/// # Ok::<(), montage_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Heap {
    inner: Arc<Inner>,
}

/// What every handle of one open heap shares. Dropping the last handle closes the heap if
/// [`Heap::close`] has not.
struct Inner {
    shared: Arc<Shared>,
    /// The background advancer, taken when the heap closes.
    advancer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The state of an open heap, shared with its background advancer.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) media: Media,
    pub(crate) geometry: Geometry,
    pub(crate) alloc: Allocator,
    pub(crate) epochs: Epochs,
    directory: Mutex<Vec<Option<String>>>,
    pub(crate) types: Registry,
    report: RecoveryReport,
    backend: BackendKind,
    /// When operations' writes are written back.
    pub(crate) write_back: WriteBack,
    /// Holds the `flock`; dropped after `media`, so the file is unmapped before it unlocks.
    file: Option<(File, PathBuf)>,
}

impl Heap {
    /// Creates a new heap as `config` describes. A file heap is created at the configured
    /// path, which must not exist yet.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyExists`] if the file exists (it is left untouched), [`Error::BadSize`]
    /// for a size that cannot hold a heap, [`Error::Io`] if the file cannot be created or
    /// sized, [`Error::InvalidConfig`] for an inconsistent configuration.
    pub fn create(config: &HeapConfig) -> Result<Heap> {
        config.validate()?;
        let creation_id = random_id();
        let geometry = Geometry::for_new(config.size, creation_id)?;
        let len = usize::try_from(geometry.heap_size).map_err(|_| Error::BadSize {
            size: geometry.heap_size,
            why: "larger than the address space",
        })?;
        let (mapping, file) = match &config.location {
            Location::File(path) => {
                let file = match OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(path)
                {
                    Ok(file) => file,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        return Err(Error::AlreadyExists { path: path.clone() });
                    }
                    Err(e) => return Err(Error::io("create", path, e)),
                };
                let made = lock_file(&file, path)
                    .and_then(|()| {
                        file.set_len(geometry.heap_size)
                            .map_err(|e| Error::io("set_len", path, e))
                    })
                    .and_then(|()| {
                        Mapping::file(&file, len, wants_map_sync(config.backend))
                            .map_err(|e| Error::io("mmap", path, e))
                    });
                match made {
                    Ok(mapping) => (mapping, Some((file, path.clone()))),
                    Err(err) => {
                        // We made this file a moment ago and it holds nothing yet.
                        drop(file);
                        let _ = std::fs::remove_file(path);
                        return Err(err);
                    }
                }
            }
            Location::Memory => (
                Mapping::anonymous(len).map_err(|e| Error::io("mmap", Path::new("<memory>"), e))?,
                None,
            ),
        };
        let region = Region::new(mapping);
        let backend = Backend::new(config, || vec![0u8; len])?;
        let media = Media::new(region, backend);
        format(&media, &geometry)?;
        let free = FreeState {
            free_spans: (0..geometry.span_count).collect(),
            ..FreeState::new(geometry.span_count)
        };
        let shared = Shared {
            alloc: Allocator::new(geometry, config.thread_slots, free),
            epochs: Epochs::new(INITIAL_EPOCH, 1, config.thread_slots, config.epoch_length),
            media,
            geometry,
            directory: Mutex::new(vec![None; DIRECTORY_CAPACITY]),
            types: Registry::empty(),
            report: RecoveryReport {
                clean_shutdown: true,
                ..RecoveryReport::default()
            },
            backend: config.backend,
            write_back: config.write_back,
            file,
        };
        Heap::start(shared)
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

    /// Opens an existing heap file with a recovery decision of the caller's instead of the
    /// epoch rule: the raw block layer's recovery, for tools and tests that manage block
    /// lifetimes themselves. Dropped blocks are durably invalidated before this returns.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub fn open_with(
        config: &HeapConfig,
        decide: impl Fn(&BlockView<'_>) -> Verdict + Sync,
    ) -> Result<Heap> {
        Self::open_file(config, Policy::Custom(&decide))
    }

    fn open_file(config: &HeapConfig, policy: Policy<'_>) -> Result<Heap> {
        config.validate()?;
        match &config.location {
            Location::File(path) => Self::open_source(config, Source::File(path), policy),
            Location::Memory => Err(Error::InvalidConfig {
                what: "an in-memory heap cannot be opened; use open_image",
            }),
        }
    }

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

    /// [`open_image`](Self::open_image) with a recovery decision of the caller's, as
    /// [`open_with`](Self::open_with).
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open), for the image's contents.
    pub fn open_image_with(
        image: CrashImage,
        config: &HeapConfig,
        decide: impl Fn(&BlockView<'_>) -> Verdict + Sync,
    ) -> Result<Heap> {
        Self::open_image_policy(image, config, Policy::Custom(&decide))
    }

    fn open_image_policy(
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
        Self::open_source(config, Source::Image(image.into_bytes()), policy)
    }

    fn open_source(config: &HeapConfig, source: Source<'_>, policy: Policy<'_>) -> Result<Heap> {
        let (geometry, mapping, file, initial) = match source {
            Source::File(path) => {
                let mut file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .map_err(|e| Error::io("open", path, e))?;
                lock_file(&file, path)?;
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
                let len = usize::try_from(geometry.heap_size).map_err(|_| Error::BadSize {
                    size: geometry.heap_size,
                    why: "larger than the address space",
                })?;
                let mapping = Mapping::file(&file, len, wants_map_sync(config.backend))
                    .map_err(|e| Error::io("mmap", path, e))?;
                (geometry, mapping, Some((file, path.to_path_buf())), None)
            }
            Source::Image(bytes) => {
                let geometry = Geometry::from_superblock(&bytes, bytes.len() as u64)?;
                let mapping = Mapping::anonymous(bytes.len())
                    .map_err(|e| Error::io("mmap", Path::new("<memory>"), e))?;
                (geometry, mapping, None, Some(bytes))
            }
        };
        let region = Region::new(mapping);
        if let Some(bytes) = &initial {
            // Loading the image is not a store the simulator should see: it is the durable
            // state the simulator starts from.
            region.write(0, bytes)?;
        }
        let backend = Backend::new(config, || initial.unwrap_or_default())?;
        let media = Media::new(region, backend);

        // PERSIST: INV-REC-1: recovery decides on the durable image, so whatever a crashed
        // process left dirty is written back before it is read.
        media.settle_before_recovery(geometry.data_offset)?;
        let clean = media.load(CLEAN_SHUTDOWN_OFFSET)? == 1;
        let epoch = media.load(EPOCH_OFFSET)?;
        if epoch < INITIAL_EPOCH {
            return Err(Error::Corrupted {
                offset: EPOCH_OFFSET,
                what: "the epoch word is below the first epoch",
            });
        }
        let options = recovery::Options {
            threads: config.recovery_threads,
            progress: config.progress.as_ref().map(|p| &*p.0),
        };
        let recovered = match policy {
            Policy::Epochs => recovery::recover_epochs(&media, &geometry, options, epoch)?,
            Policy::Custom(decide) => recovery::recover(&media, &geometry, options, decide)?,
        };
        let recovery::Recovered {
            free,
            mut report,
            max_uid,
            antis,
        } = recovered;
        let next_uid = max_uid + 1;
        report.clean_shutdown = clean;
        let directory = read_directory(&media, &geometry)?;
        let types = Registry::load(&media, geometry.creation_id)?;
        media.store(CLEAN_SHUTDOWN_OFFSET, 0)?;
        // PERSIST: the heap is marked open (not cleanly shut down) before it is used.
        media.persist(CLEAN_SHUTDOWN_OFFSET, 8)?;
        let shared = Shared {
            alloc: Allocator::new(geometry, config.thread_slots, free),
            epochs: Epochs::new(epoch, next_uid, config.thread_slots, config.epoch_length),
            media,
            geometry,
            directory: Mutex::new(directory),
            types,
            report,
            backend: config.backend,
            write_back: config.write_back,
            file,
        };
        let heap = Heap::start(shared)?;
        // The anti-blocks recovery kept shadow versions it has durably invalidated; they can
        // go now (INV-EP-3), in a fence of their own after the one that covered the victims.
        heap.shared().alloc.release(&heap.shared().media, &antis)?;
        Ok(heap)
    }

    /// What recovery found when this heap was opened (all zero for a new heap).
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.shared().report
    }

    /// The heap file, for a file heap.
    pub fn path(&self) -> Option<&Path> {
        self.shared().file.as_ref().map(|(_, path)| path.as_path())
    }

    /// The heap's size in bytes.
    pub fn size(&self) -> u64 {
        self.shared().geometry.heap_size
    }

    /// The random id chosen when the heap was created.
    pub fn creation_id(&self) -> u64 {
        self.shared().geometry.creation_id
    }

    /// The backend this heap was opened with.
    pub fn backend(&self) -> BackendKind {
        self.shared().backend
    }

    /// Whether the heap is mapped with `MAP_SYNC` on a DAX file system, so that cache-line
    /// write-back reaches the media without `msync`.
    pub fn is_dax(&self) -> bool {
        self.shared().media.region().mapping().is_dax()
    }

    /// The power-failure simulator, if this heap runs on [`BackendKind::Simulated`].
    pub fn simulator(&self) -> Option<Arc<Simulator>> {
        self.shared().media.simulator().cloned()
    }

    /// Space statistics.
    pub fn stats(&self) -> AllocStats {
        self.shared().alloc.stats()
    }

    // ---- named structures ------------------------------------------------------------

    /// The owner id of the structure called `name`, registering it if it is new. The
    /// registration is durable when this returns.
    ///
    /// # Errors
    ///
    /// [`Error::BadName`] for an empty or over-long name (or one containing NUL bytes),
    /// [`Error::DirectoryFull`] when every slot is taken.
    pub fn register(&self, name: &str) -> Result<OwnerId> {
        check_name(name)?;
        self.shared().epochs.check_open()?;
        let mut dir = self
            .shared()
            .directory
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(index) = dir.iter().position(|n| n.as_deref() == Some(name)) {
            return Ok(owner_of(index));
        }
        let index = dir
            .iter()
            .position(Option::is_none)
            .ok_or_else(|| Error::DirectoryFull {
                capacity: DIRECTORY_CAPACITY,
            })?;
        let owner = owner_of(index);
        let mut entry: table::Body = [0; ENTRY_VALID_OFFSET as usize];
        entry[..name.len()].copy_from_slice(name.as_bytes());
        entry[DIR_OWNER_OFFSET as usize..DIR_OWNER_OFFSET as usize + 8]
            .copy_from_slice(&u64::from(owner.0).to_le_bytes());
        let creation_id = self.shared().geometry.creation_id;
        // The name is durable before its owner id is handed out.
        table::write_entry(
            &self.shared().media,
            DIRECTORY,
            creation_id,
            index as u64,
            &entry,
        )?;
        dir[index] = Some(name.to_owned());
        Ok(owner)
    }

    /// The owner id of the structure called `name`, if it is registered.
    pub fn lookup(&self, name: &str) -> Option<OwnerId> {
        let dir = self
            .shared()
            .directory
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        dir.iter()
            .position(|n| n.as_deref() == Some(name))
            .map(owner_of)
    }

    /// Every registered structure, with its owner id.
    pub fn structures(&self) -> Vec<(String, OwnerId)> {
        let dir = self
            .shared()
            .directory
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        dir.iter()
            .enumerate()
            .filter_map(|(i, n)| n.clone().map(|n| (n, owner_of(i))))
            .collect()
    }

    // ---- blocks ----------------------------------------------------------------------

    /// Allocates a block for `len` payload bytes with the header `spec`. The payload starts
    /// out with whatever the block held before; nothing is durable until
    /// [`persist_block`](Self::persist_block) or a flush and fence cover it.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfSpace`] when the heap cannot fit the block; [`Error::Poisoned`] after a
    /// failed write-back.
    pub fn alloc(&self, spec: BlockSpec, len: u64) -> Result<PBlock> {
        self.shared().epochs.check_open()?;
        self.shared().alloc.alloc(&self.shared().media, spec, len)
    }

    /// Allocates a block holding `bytes`.
    ///
    /// # Errors
    ///
    /// As [`alloc`](Self::alloc).
    pub fn alloc_bytes(&self, spec: BlockSpec, bytes: &[u8]) -> Result<PBlock> {
        let block = self.alloc(spec, bytes.len() as u64)?;
        self.shared().media.write(block.payload_offset(), bytes)?;
        Ok(block)
    }

    /// Frees `block`. Its header is invalidated at once; the block is reused only after the
    /// invalidation is durable, so a crash can never bring its old contents back.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlock`] if `block` is not a live block (a double free).
    pub fn free(&self, block: PBlock) -> Result<()> {
        self.shared().epochs.check_open()?;
        self.shared().alloc.free(&self.shared().media, block)
    }

    /// The handle of the live block whose header is at `offset` (for handles stored as
    /// plain offsets, for example inside other payloads).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlock`] unless a live block starts at `offset`.
    pub fn block_at(&self, offset: u64) -> Result<PBlock> {
        let block = PBlock(offset);
        self.info(block).map(|_| block)
    }

    /// The header of a live block.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlock`] if `block` is not a live block of this heap.
    pub fn info(&self, block: PBlock) -> Result<BlockInfo> {
        self.shared().alloc.header(&self.shared().media, block)
    }

    /// Writes `bytes` into `block`'s payload at byte `at`.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfBounds`] if the range leaves the block's capacity;
    /// [`Error::InvalidBlock`] if `block` is not a block of this heap.
    pub fn write(&self, block: PBlock, at: u64, bytes: &[u8]) -> Result<()> {
        self.shared().epochs.check_open()?;
        let offset = self.payload_range(block, at, bytes.len() as u64)?;
        self.shared().media.write(offset, bytes)
    }

    /// Reads `buf.len()` bytes of `block`'s payload from byte `at`.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write).
    pub fn read(&self, block: PBlock, at: u64, buf: &mut [u8]) -> Result<()> {
        let offset = self.payload_range(block, at, buf.len() as u64)?;
        self.shared().media.read(offset, buf)
    }

    /// The payload of a live block (its recorded length).
    ///
    /// Outside an operation this reads whatever the block holds now: possibly bytes an
    /// operation is writing, possibly a version a crash would drop. It is always memory-safe
    /// but promises no consistency; structures read inside operations
    /// ([`OpGuard::read`](crate::OpGuard::read)), which also check epochs.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlock`] if `block` is not a live block.
    pub fn read_payload(&self, block: PBlock) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_payload_into(block, &mut buf)?;
        Ok(buf)
    }

    /// [`read_payload`](Self::read_payload) into `buf` (resized to the payload's length), so
    /// that a caller with a buffer of its own allocates nothing.
    ///
    /// A structure may read this way, outside any operation, when the block cannot change
    /// or be retired while it reads: when every write to the block and the block's removal
    /// from the structure's index happen under a lock the reader holds (see "Reads outside
    /// operations" in `docs/design.md`).
    ///
    /// # Errors
    ///
    /// As [`read_payload`](Self::read_payload).
    pub fn read_payload_into(&self, block: PBlock, buf: &mut Vec<u8>) -> Result<()> {
        let info = self.info(block)?;
        buf.resize(info.len as usize, 0);
        self.shared().media.read(block.payload_offset(), buf)
    }

    fn payload_range(&self, block: PBlock, at: u64, len: u64) -> Result<u64> {
        let capacity = self.shared().alloc.capacity(block)?;
        if at.checked_add(len).is_none_or(|end| end > capacity) {
            return Err(Error::OutOfBounds { offset: at, len });
        }
        Ok(block.payload_offset() + at)
    }

    /// Starts writing back `block`'s header and payload; durable after this thread's next
    /// [`fence`](Self::fence).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlock`] for a handle that is not a block of this heap;
    /// [`Error::Poisoned`] after a failed write-back.
    pub fn flush_block(&self, block: PBlock) -> Result<()> {
        let capacity = self.shared().alloc.capacity(block)?;
        // The recorded length bounds the write-back; the header is not validated here, which
        // a flush does not need (a bad length only flushes more or less of this block).
        let recorded = self.shared().media.load(block.offset() + LEN_WORD_OFFSET)? >> 32;
        let len = recorded.min(capacity);
        // PERSIST: header and payload start their write-back; the caller's fence completes it.
        self.shared().media.flush(block.offset(), HEADER_LEN + len)
    }

    /// Waits until everything this thread flushed is durable.
    ///
    /// # Errors
    ///
    /// [`Error::WriteBack`] if `msync` fails (the heap is poisoned from then on), or
    /// [`Error::Poisoned`] after an earlier failure.
    pub fn fence(&self) -> Result<()> {
        // PERSIST: completes this thread's earlier flushes.
        self.shared().media.fence()
    }

    /// Makes `block`'s header and payload durable.
    ///
    /// # Errors
    ///
    /// As [`flush_block`](Self::flush_block) and [`fence`](Self::fence).
    pub fn persist_block(&self, block: PBlock) -> Result<()> {
        // PERSIST: the block is durable when the fence returns.
        self.flush_block(block)?;
        self.fence()
    }

    // ---- scanning --------------------------------------------------------------------

    /// Visits every valid block matching `filter`, in parallel over the heap's spans. Blocks
    /// allocated or freed while the scan runs may or may not be seen. Returns how many blocks
    /// were visited.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupted`] if the span table is damaged; any error `visit` returns.
    pub fn scan(
        &self,
        filter: ScanFilter,
        threads: usize,
        visit: impl Fn(&BlockView<'_>) -> Result<()> + Sync,
    ) -> Result<u64> {
        let units = scan::read_span_table(&self.shared().media, &self.shared().geometry)?;
        let progress = std::sync::atomic::AtomicU64::new(0);
        let work = |unit: UnitVisit<'_>| -> Result<u64> {
            let mut seen = 0;
            for view in unit.blocks.iter().filter_map(|(_, v)| v.as_ref()) {
                if filter.matches(view.info()) {
                    visit(view)?;
                    seen += 1;
                }
            }
            Ok(seen)
        };
        let options = scan::ScanOptions {
            threads,
            settle: false,
            progress: None,
        };
        let counts = scan::scan(
            &self.shared().media,
            &self.shared().geometry,
            &units,
            options,
            &progress,
            &work,
            &|| Ok(()),
        )?;
        Ok(counts.into_iter().sum())
    }

    /// The headers of every valid block matching `filter`, in heap order.
    ///
    /// # Errors
    ///
    /// As [`scan`](Self::scan).
    pub fn collect(&self, filter: ScanFilter) -> Result<Vec<BlockInfo>> {
        let found = Mutex::new(Vec::new());
        self.scan(filter, 1, |view| {
            found
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(*view.info());
            Ok(())
        })?;
        let mut found = found.into_inner().unwrap_or_else(PoisonError::into_inner);
        found.sort_unstable_by_key(|info| info.block);
        Ok(found)
    }

    // ---- shutdown --------------------------------------------------------------------

    /// Closes the heap cleanly: running operations end, everything completed becomes durable,
    /// pending frees are made durable, and the clean-shutdown flag is set and written back.
    /// Other handles of this heap see [`Error::Closed`] from then on (see "Closing" above);
    /// the file lock is released when the last of them is dropped.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] if another handle closed the heap already;
    /// [`Error::SyncInOperation`] if the calling thread has an operation open on this heap
    /// (the heap is then left open); any write-back failure, after which the heap is not
    /// marked clean and its next open runs a full recovery as after a crash.
    pub fn close(self) -> Result<()> {
        if crate::epoch::op::has_active_op(self.shared().epochs.instance()) {
            return Err(Error::SyncInOperation);
        }
        self.inner.shutdown()
    }

    #[cfg(test)]
    pub(crate) fn media(&self) -> &Media {
        &self.shared().media
    }

    /// Wraps the shared state and starts the background advancer, if any.
    fn start(shared: Shared) -> Result<Heap> {
        let shared = Arc::new(shared);
        let advancer = match shared.epochs.length {
            EpochLength::Manual => None,
            EpochLength::Every(length) => {
                let for_thread = Arc::clone(&shared);
                let handle = std::thread::Builder::new()
                    .name("montage-epoch".to_owned())
                    .spawn(move || crate::epoch::run_advancer(&for_thread, length))
                    .map_err(|e| Error::io("spawn the epoch advancer", Path::new("<thread>"), e))?;
                Some(handle)
            }
        };
        Ok(Heap {
            inner: Arc::new(Inner {
                shared,
                advancer: Mutex::new(advancer),
            }),
        })
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    // ---- epochs ----------------------------------------------------------------------

    /// The current epoch: the one new operations join, and the value of the stored epoch
    /// word.
    pub fn epoch(&self) -> u64 {
        self.shared().epochs.current()
    }

    /// Makes everything that completed before this call durable: returns once the stored
    /// epoch is at least two past the epoch of every operation that ended before the call
    /// (at once when nothing is waiting to be written back; otherwise after advancing the clock
    /// two epochs past the call). Concurrent callers share the same advances (group commit).
    ///
    /// # Errors
    ///
    /// [`Error::SyncInOperation`] if called inside an operation on this heap (it would wait
    /// for itself); [`Error::ClockStopped`] if an advance failed, or the advance's own error.
    pub fn sync(&self) -> Result<()> {
        if crate::epoch::op::has_active_op(self.shared().epochs.instance()) {
            return Err(Error::SyncInOperation);
        }
        self.shared().epochs.sync(self.shared())
    }

    /// Advances the clock by one epoch now (the background advancer does this every epoch
    /// length; with [`EpochLength::Manual`] only this and [`sync`](Self::sync) do).
    ///
    /// # Errors
    ///
    /// As [`sync`](Self::sync).
    pub fn advance_epoch(&self) -> Result<u64> {
        if crate::epoch::op::has_active_op(self.shared().epochs.instance()) {
            return Err(Error::SyncInOperation);
        }
        self.shared().epochs.advance(self.shared())
    }

    /// How many epoch advances this heap has made since it was opened.
    pub fn advances(&self) -> u64 {
        self.shared().epochs.advances()
    }
}

impl std::fmt::Debug for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heap")
            .field("path", &self.path())
            .field("size", &self.shared().geometry.heap_size)
            .field("backend", &self.shared().backend)
            .field(
                "creation_id",
                &format_args!("{:#018x}", self.shared().geometry.creation_id),
            )
            .field("stats", &self.shared().alloc.stats())
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// Closes the heap once (see [`Heap::close`]); a second call fails with
    /// [`Error::Closed`].
    fn shutdown(&self) -> Result<()> {
        let shared = &*self.shared;
        // From here on no operation begins, and the ones running are waited for.
        if !shared.epochs.close() {
            return Err(Error::Closed);
        }
        shared.epochs.request_shutdown();
        let advancer = self
            .advancer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(advancer) = advancer {
            // A panicked advancer stopped the clock; the sync below reports it.
            let _ = advancer.join();
        }
        // A final sync: everything completed so far becomes durable.
        shared.epochs.sync_closing(shared)?;
        shared.alloc.drain_all(&shared.media)?;
        shared.media.store(CLEAN_SHUTDOWN_OFFSET, 1)?;
        // PERSIST: the clean flag is the last thing written; everything before it is durable
        // by the drains above and by the callers' own persists.
        shared.media.persist(CLEAN_SHUTDOWN_OFFSET, 8)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last handle is gone. Best effort, as a file's Drop: errors cannot be reported
        // from here (`close` reports them), and a heap closed already has nothing to do.
        let _ = self.shutdown();
    }
}

fn owner_of(index: usize) -> OwnerId {
    OwnerId(u32::try_from(index + 1).unwrap_or(u32::MAX))
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > NAME_MAX || name.as_bytes().contains(&0) {
        return Err(Error::BadName {
            len: name.len(),
            max: NAME_MAX,
        });
    }
    Ok(())
}

fn wants_map_sync(backend: BackendKind) -> bool {
    matches!(backend, BackendKind::Pmem | BackendKind::Eadr)
}

fn lock_file(file: &File, path: &Path) -> Result<()> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Locked {
            path: path.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(Error::io("flock", path, e)),
    }
}

fn random_id() -> u64 {
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// Writes a new heap's superblock. The magic goes last, so a crash while formatting leaves
/// a file that open rejects as "not a heap" rather than a half-made heap.
fn format(media: &Media, geometry: &Geometry) -> Result<()> {
    let head = geometry.superblock();
    let bytes = head.as_bytes();
    media.write(8, &bytes[8..])?;
    media.store(EPOCH_OFFSET, INITIAL_EPOCH)?;
    media.store(CLEAN_SHUTDOWN_OFFSET, 0)?;
    // PERSIST: every superblock field is durable before the magic that makes it a heap.
    media.persist(0, geometry.data_offset)?;
    media.write(MAGIC_OFFSET, &bytes[..8])?;
    // PERSIST: the heap exists once the magic is durable.
    media.persist(MAGIC_OFFSET, 8)
}

/// The directory's names. A registration torn by a crash never returned its id to anyone,
/// so `read_entries` clears it.
fn read_directory(media: &Media, geometry: &Geometry) -> Result<Vec<Option<String>>> {
    table::read_entries(media, DIRECTORY, geometry.creation_id, |index, entry| {
        let name_bytes = &entry[..NAME_MAX];
        let end = name_bytes.iter().position(|&b| b == 0).unwrap_or(NAME_MAX);
        let owner = u64::from_le_bytes(
            entry[DIR_OWNER_OFFSET as usize..DIR_OWNER_OFFSET as usize + 8]
                .try_into()
                .unwrap_or([0; 8]),
        );
        let name = std::str::from_utf8(&name_bytes[..end]).ok()?;
        (owner == index + 1 && !name.is_empty()).then(|| name.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn a_failed_msync_poisons_every_later_write_and_sync() {
        let dir = tempfile::tempdir().unwrap();
        let config = HeapConfig::new(dir.path().join("poison.heap")).size(1 << 20);
        let heap = Heap::create(&config).unwrap();
        let block = heap.alloc_bytes(BlockSpec::new(1, 1), b"before").unwrap();
        let state = heap.media().msync_state().unwrap();
        state.fail_next.store(true, Ordering::Relaxed);
        assert!(matches!(
            heap.persist_block(block),
            Err(Error::WriteBack { .. })
        ));
        assert!(matches!(heap.fence(), Err(Error::Poisoned)));
        assert!(matches!(
            heap.write(block, 0, b"after"),
            Err(Error::Poisoned)
        ));
        assert!(matches!(
            heap.alloc(BlockSpec::new(1, 2), 8),
            Err(Error::Poisoned)
        ));
        assert!(matches!(heap.close(), Err(Error::Poisoned)));
        // The heap was not marked clean; reopening recovers it like after a crash.
        let heap = Heap::open(&config).unwrap();
        assert!(!heap.recovery_report().clean_shutdown);
    }

    #[test]
    fn a_failed_advance_stops_the_clock_and_sync_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let config = HeapConfig::new(dir.path().join("stopped.heap"))
            .size(1 << 20)
            .epoch_length(EpochLength::Manual);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("kv").unwrap();
        heap.run_op(|op| op.alloc(owner, 1, b"payload")).unwrap();
        let state = heap.media().msync_state().unwrap();
        state.fail_next.store(true, Ordering::Relaxed);
        assert!(matches!(heap.sync(), Err(Error::WriteBack { .. })));
        // From now on nothing can be promised durable: every caller hears it, none hangs.
        assert!(matches!(heap.sync(), Err(Error::ClockStopped { .. })));
        assert!(matches!(heap.begin_op(), Err(Error::ClockStopped { .. })));
        assert!(matches!(
            heap.advance_epoch(),
            Err(Error::ClockStopped { .. })
        ));
    }

    #[test]
    fn recovery_reports_progress() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("progress.heap");
        let heap = Heap::create(&HeapConfig::new(&path).size(4 << 20)).unwrap();
        let owner = heap.register("kv").unwrap();
        for i in 0..3000u32 {
            heap.run_op(|op| op.alloc(owner, 1, &i.to_le_bytes()))
                .unwrap();
        }
        heap.close().unwrap();
        let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&seen);
        let config = HeapConfig::new(&path)
            .recovery_threads(1)
            .on_recovery_progress(move |n| sink.lock().unwrap().push(n));
        let heap = Heap::open(&config).unwrap();
        assert_eq!(heap.recovery_report().blocks_kept, 3000);
        let seen = seen.lock().unwrap();
        assert!(
            seen.len() >= 2,
            "progress was reported {} times",
            seen.len()
        );
        assert!(
            seen.windows(2).all(|w| w[0] <= w[1]),
            "progress went backwards"
        );
        assert_eq!(
            *seen.last().unwrap(),
            2 * heap.recovery_report().blocks_scanned
        );
    }

    #[test]
    fn heap_is_send_and_sync_and_shared_by_reference() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<Heap>();
        assert_send_sync::<HeapConfig>();
        let heap = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let owner = heap.register("kv").unwrap();
        std::thread::scope(|s| {
            for i in 0..2u8 {
                let heap = &heap;
                s.spawn(move || heap.run_op(|op| op.alloc(owner, 1, &[i])).unwrap());
            }
        });
        assert_eq!(
            heap.collect(ScanFilter::all().owner(owner)).unwrap().len(),
            2
        );
    }

    #[test]
    fn closing_one_handle_refuses_writes_through_every_other() {
        let dir = tempfile::tempdir().unwrap();
        let config = HeapConfig::new(dir.path().join("clones.heap")).size(1 << 20);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("kv").unwrap();
        let block = heap.run_op(|op| op.alloc(owner, 1, b"kept")).unwrap();
        let other = heap.clone();
        heap.close().unwrap();
        assert!(matches!(other.begin_op(), Err(Error::Closed)));
        assert!(matches!(other.sync(), Err(Error::Closed)));
        assert!(matches!(other.advance_epoch(), Err(Error::Closed)));
        assert!(matches!(other.register("new"), Err(Error::Closed)));
        assert!(matches!(
            other.alloc(BlockSpec::new(1, 1), 8),
            Err(Error::Closed)
        ));
        assert!(matches!(other.write(block, 0, b"x"), Err(Error::Closed)));
        assert!(matches!(other.clone().close(), Err(Error::Closed)));
        // Reads still see the closed heap, and the file stays locked while a handle lives.
        assert_eq!(other.read_payload(block).unwrap(), b"kept");
        assert!(matches!(Heap::open(&config), Err(Error::Locked { .. })));
        drop(other);
        let heap = Heap::open(&config).unwrap();
        assert!(heap.recovery_report().clean_shutdown);
        let found = heap.collect(ScanFilter::all().owner(owner)).unwrap();
        assert_eq!(found.len(), 1);
    }

    #[test]
    fn dropping_the_last_handle_closes_the_heap_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let config = HeapConfig::new(dir.path().join("last.heap")).size(1 << 20);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("kv").unwrap();
        let other = heap.clone();
        drop(heap);
        other.run_op(|op| op.alloc(owner, 1, b"late")).unwrap();
        drop(other);
        let heap = Heap::open(&config).unwrap();
        assert!(heap.recovery_report().clean_shutdown);
        assert_eq!(
            heap.collect(ScanFilter::all().owner(owner)).unwrap().len(),
            1
        );
    }

    #[test]
    fn close_waits_for_a_running_operation_and_keeps_its_writes() {
        let dir = tempfile::tempdir().unwrap();
        let config = HeapConfig::new(dir.path().join("running.heap")).size(1 << 20);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("kv").unwrap();
        let (started, wait_started) = std::sync::mpsc::channel();
        let worker = {
            let heap = heap.clone();
            std::thread::spawn(move || {
                let op = heap.begin_op().unwrap();
                op.alloc(owner, 1, b"first").unwrap();
                started.send(()).unwrap();
                // Close is called now; it must wait for this operation to end.
                std::thread::sleep(std::time::Duration::from_millis(100));
                op.alloc(owner, 1, b"second").unwrap();
                drop(op);
                assert!(matches!(heap.begin_op(), Err(Error::Closed)));
            })
        };
        wait_started.recv().unwrap();
        heap.close().unwrap();
        worker.join().unwrap();
        let heap = Heap::open(&config).unwrap();
        assert!(heap.recovery_report().clean_shutdown);
        let mut found: Vec<Vec<u8>> = heap
            .collect(ScanFilter::all().owner(owner))
            .unwrap()
            .into_iter()
            .map(|info| heap.read_payload(info.block).unwrap())
            .collect();
        found.sort();
        assert_eq!(found, [b"first".to_vec(), b"second".to_vec()]);
    }

    #[test]
    fn close_inside_an_operation_is_refused_and_leaves_the_heap_open() {
        let heap = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let op = heap.begin_op().unwrap();
        assert!(matches!(heap.clone().close(), Err(Error::SyncInOperation)));
        drop(op);
        heap.register("still-open").unwrap();
        heap.close().unwrap();
    }

    #[test]
    fn an_idle_heap_stops_advancing_and_an_idle_sync_is_free() {
        let config = HeapConfig::in_memory(1 << 20)
            .backend(BackendKind::Pmem)
            .epoch_length(EpochLength::Every(std::time::Duration::from_millis(1)));
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("kv").unwrap();
        let block = heap.run_op(|op| op.alloc(owner, 1, b"a")).unwrap();
        heap.run_op(|op| op.delete(block)).unwrap();
        // Let the clock write back and reclaim everything, then watch it stand still.
        let mut previous = heap.advances();
        let settled = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            let now = heap.advances();
            let idle = now == previous;
            previous = now;
            idle
        });
        assert!(settled, "the clock kept advancing on an idle heap");
        let before = heap.advances();
        heap.sync().unwrap();
        assert_eq!(
            heap.advances(),
            before,
            "a sync with nothing to write advanced the clock"
        );
        // With something to write, sync advances.
        heap.run_op(|op| op.alloc(owner, 1, b"b")).unwrap();
        heap.sync().unwrap();
        assert!(heap.advances() > before);
    }
}
