//! `OpGuard`: one operation, bound to the epoch it announced. Everything an operation does
//! to payloads goes through it, so the epoch rules of DESIGN.md section 5 hold: payloads of
//! the operation's own epoch are changed in place, older ones by copy-on-write, deletion
//! writes an anti-block, and meeting a payload of a newer epoch aborts the operation.

use std::cell::{Cell, RefCell, RefMut};
use std::marker::PhantomData;

use super::nodes::NodeCache;
use super::{OpAnnouncement, Runtime};
use crate::alloc::Allocator;
use crate::alloc::block::{BlockInfo, BlockKind, BlockSpec, BlockView, OwnerId, PBlock};
use crate::base::epoch::Epoch;
use crate::base::layout::{HEADER_LEN, TRAILER_LEN};
use crate::config::WriteBack;
use crate::error::{Error, Result};

/// What a thread keeps between its operations that needs a destructor: kept off the
/// operation path, which uses the plain cells below and the thread's slot.
struct ThreadState {
    /// The heaps (by instance id) on which this thread has an operation open in a shared
    /// slot: operations do not nest, and `sync` inside one would wait for itself. (In an
    /// owned slot the slot's busy flag says so.)
    shared_active: Vec<u64>,
    /// Payload types this thread has checked against a heap's registry: (heap instance,
    /// type id).
    types: Vec<(u64, u64)>,
}

/// How many (heap, type) pairs a thread remembers as checked.
const TYPE_CACHE: usize = 64;

impl ThreadState {
    const fn new() -> ThreadState {
        ThreadState {
            shared_active: Vec::new(),
            types: Vec::new(),
        }
    }
}

thread_local! {
    static LOCAL: RefCell<ThreadState> = const { RefCell::new(ThreadState::new()) };
    /// A range of uids reserved for this thread: (heap instance, next, end). A plain cell
    /// with no destructor, so that its access is one thread-relative load or store.
    static UIDS: Cell<(u64, u64, u64)> = const { Cell::new((0, 0, 0)) };
    /// The epoch of the last operation this thread committed: (heap instance, epoch).
    static LAST_COMMIT: Cell<(u64, Epoch)> = const { Cell::new((0, Epoch::ZERO)) };
    /// How this thread's recent updates went, a saturating count from 0 to 3: up when an
    /// update wrote a new version, down when it wrote in place. `update` fills a new block
    /// before it reads the old header only while it is 2 or more (see there).
    static NEW_VERSIONS: Cell<u8> = const { Cell::new(2) };
}

/// A new version's payload, as `OpGuard::supersede` writes it.
#[derive(Clone, Copy)]
enum NewVersion<'b> {
    /// Bytes for a block still to be allocated.
    Bytes(&'b [u8]),
    /// A block from `OpGuard::filled_block`, holding this many payload bytes and their
    /// checksum, its header still to be written.
    Filled(PBlock, u64),
}

/// What a write in place of a block of an older epoch fails with.
#[cold]
fn older_epoch() -> Error {
    Error::Unsupported {
        what: "writes in place to a block of an older epoch than the operation's",
    }
}

/// One block an operation keeps out of its log (see `OpGuard::keep`), or none: half the
/// size of a `Cell<Option<PBlock>>`, as no block starts at offset 0 (the heap's header
/// does), so that the guard stays small enough to be moved without a call to `memcpy`.
#[derive(Debug, Default)]
struct Kept(Cell<u64>);

impl Kept {
    /// What [`finish`](Self::finish) leaves: no block starts at offset 1 (offsets are
    /// multiples of 8).
    const FINISHED: u64 = 1;

    fn get(&self) -> Option<PBlock> {
        let offset = self.0.get();
        debug_assert_ne!(
            offset,
            Self::FINISHED,
            "a finished guard's cell is not read"
        );
        (offset != 0).then_some(PBlock(offset))
    }

    /// Marks the cell finished, forgetting its block; returns whether it was already. For
    /// the guard's first allocation, which nothing reads once the operation has ended: the
    /// mark is the guard's record that it has ended (a flag of its own would make the guard
    /// too large to be moved without a call to `memcpy`).
    fn finish(&self) -> bool {
        self.0.replace(Self::FINISHED) == Self::FINISHED
    }

    fn set(&self, block: PBlock) {
        debug_assert_ne!(block.0, 0, "no block starts at offset 0");
        self.0.set(block.0);
    }

    fn take(&self) -> Option<PBlock> {
        let kept = self.get();
        self.0.set(0);
        kept
    }

    fn is_empty(&self) -> bool {
        self.0.get() == 0
    }
}

/// What an operation's first deletion left (see `OpGuard::delete_known`): the block it
/// killed, of the operation's own epoch, or the anti-block it wrote for an older one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deletion {
    /// A block of this epoch, invalidated when the operation commits, and who may reach it.
    Kill(PBlock, Reach),
    /// An anti-block.
    Anti(PBlock),
}

/// An operation's first [`Deletion`], kept out of its log as [`Kept`] keeps a block, in
/// one word: block offsets are multiples of 8, which leaves the low bits for the kind (bit
/// 1 a kill, bit 0 one no one else reaches). One word for both kinds, as an operation that
/// deletes one payload leaves one or the other, keeps the guard small enough to be moved
/// without a call to `memcpy`.
#[derive(Debug, Default)]
struct KeptDeletion(Cell<u64>);

impl KeptDeletion {
    const KILL: u64 = 0b10;
    const UNSHARED: u64 = 0b01;

    fn is_empty(&self) -> bool {
        self.0.get() == 0
    }

    fn set(&self, deletion: Deletion) {
        let word = match deletion {
            Deletion::Kill(block, Reach::Shared) => block.0 | Self::KILL,
            Deletion::Kill(block, Reach::Unshared) => block.0 | Self::KILL | Self::UNSHARED,
            Deletion::Anti(block) => block.0,
        };
        debug_assert!(word & !0b111 != 0, "no block starts at offset 0");
        debug_assert_eq!(word & 0b100, 0, "block offsets are multiples of 8");
        self.0.set(word);
    }

    fn take(&self) -> Option<Deletion> {
        let word = self.0.replace(0);
        let block = PBlock(word & !0b111);
        let reach = if word & Self::UNSHARED != 0 {
            Reach::Unshared
        } else {
            Reach::Shared
        };
        match word {
            0 => None,
            _ if word & Self::KILL != 0 => Some(Deletion::Kill(block, reach)),
            _ => Some(Deletion::Anti(block)),
        }
    }
}

/// A block of one epoch that operations of that epoch write in place without reading its
/// header each time: from [`OpGuard::in_place`], for [`OpGuard::write_in_place`]. Good for
/// the epoch it was found in only; a write in any other fails with [`Error::Unsupported`]
/// (not `Aborted`: running the operation again cannot make it good).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InPlace {
    block: PBlock,
    epoch: Epoch,
    /// The payload's length, which writes stay inside.
    len: u64,
    /// Whether an operation of the epoch has logged the block for its checksum already.
    resealed: bool,
}

impl InPlace {
    /// The block whose header `info` was read, for writes in place in the block's epoch.
    fn found(info: &BlockInfo) -> InPlace {
        InPlace {
            block: info.block,
            epoch: info.spec.epoch,
            len: u64::from(info.len),
            resealed: false,
        }
    }

    /// The block.
    #[inline]
    pub fn block(&self) -> PBlock {
        self.block
    }

    /// The epoch it may be written in.
    #[inline]
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The payload's length: writes stay inside it.
    #[inline]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the payload is empty (no write fits).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Records in the thread's count of recent updates (`NEW_VERSIONS`, which was `versions`)
/// whether an update wrote in place.
fn count_version(versions: u8, in_place: bool) {
    NEW_VERSIONS.set(if in_place {
        versions.saturating_sub(1)
    } else {
        (versions + 1).min(3)
    });
}

/// How many uids a thread reserves at a time.
const UID_BATCH: u64 = 1024;

/// Whether the calling thread has an operation open in a shared slot of the heap with this
/// instance id (whether it has one in its owned slot, the slot's busy flag says; both are
/// asked by [`Epochs::has_open_op`](super::Epochs::has_open_op)).
pub(crate) fn has_shared_op(instance: u64) -> bool {
    // During thread teardown the state may be gone already, and with it any operation.
    LOCAL
        .try_with(|local| local.borrow().shared_active.contains(&instance))
        .unwrap_or(false)
}

/// What an operation did, to hand to the advancer when it ends or to undo if it aborts.
/// Operations take one from their slot's spares and give it back when they end, so that an
/// operation allocates nothing once its thread has warmed up. Boxed, so that the hand-over
/// moves a pointer rather than six vectors.
#[derive(Debug, Default)]
pub(crate) struct OpLog {
    /// Byte ranges written, to write back with the operation's epoch.
    persist: Vec<(u64, u64)>,
    /// Blocks this operation allocated after its first (undone on abort).
    allocated: Vec<PBlock>,
    /// Blocks whose payload this operation changed in part, in place: the advance writes
    /// their payload checksums again (INV-SUM-1).
    resealed: Vec<PBlock>,
    /// Older versions this operation superseded or deleted (retired bit set), after the
    /// first, which the guard keeps.
    victims: Vec<PBlock>,
    /// Blocks of this epoch to invalidate when the operation commits (retired bit set).
    kills: Vec<PBlock>,
    /// Blocks of this epoch to invalidate when the operation commits and hand straight back
    /// to the thread's cache (retired bit set): no other operation can reach them
    /// ([`OpGuard::delete_unshared`]).
    reusable: Vec<PBlock>,
    /// Anti-blocks this operation wrote.
    antis: Vec<PBlock>,
}

impl OpLog {
    /// Adds what a deletion left to the kills or the anti-blocks.
    fn deleted(&mut self, deletion: Option<Deletion>) {
        match deletion {
            Some(Deletion::Kill(block, Reach::Shared)) => self.kills.push(block),
            Some(Deletion::Kill(block, Reach::Unshared)) => self.reusable.push(block),
            Some(Deletion::Anti(block)) => self.antis.push(block),
            None => {}
        }
    }

    /// Whether nothing in the log is left for the advancer: everything but the list of
    /// allocations (which only an abort uses) and the kills (which `finish` turns into
    /// victims) is empty.
    fn is_handed_over(&self) -> bool {
        self.persist.is_empty()
            && self.resealed.is_empty()
            && self.victims.is_empty()
            && self.antis.is_empty()
    }
}

/// Who may reach a block an operation deletes, once the operation has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// Other operations and readers may still hold it: it is reused only after reclamation.
    Shared,
    /// No one acts on it: the caller holds every reader's lock, or its readers validate
    /// what they read ([`OpGuard::delete_unshared`]).
    Unshared,
}

/// An operation in progress: the RAII guard `Heap::begin_op` returns. Dropping it ends the
/// operation (commits); [`abort`](Self::abort) undoes what it allocated and retired.
///
/// A guard is bound to the thread that began it (it is not `Send`).
///
/// # What an operation may rely on
///
/// Every payload it creates, updates or deletes carries its epoch; the operation takes
/// effect in that epoch, and after a crash it is either wholly recovered (its epoch is at
/// least two behind the stored clock) or wholly absent. An access that meets a payload
/// written in a newer epoch fails with [`Error::Aborted`]: the operation must be retried in a
/// new operation. Make every access that can abort before the operation's first write:
/// an abort undoes allocations and retirements, but not bytes written in place.
pub struct OpGuard<'h> {
    runtime: &'h Runtime,
    epoch: Epoch,
    /// Taken from the slot's spare logs when the operation first logs something, and given
    /// back when it ends.
    log: RefCell<Option<Box<OpLog>>>,
    /// The first block the operation allocated (undone on abort); the log lists the rest.
    /// Most operations allocate one block and log nothing else, and never take a log. Once
    /// the operation has ended, the mark that it has ([`Kept::finish`]).
    first_alloc: Kept,
    /// The first older version the operation superseded or deleted (retired bit set); the
    /// log lists the rest. An update that writes a new version needs no log either.
    first_victim: Kept,
    /// What the operation's first deletion left (a block of this epoch to kill when it
    /// commits, or an anti-block); the log lists the rest. A delete takes no log either.
    first_deletion: KeptDeletion,
    /// The operation's announcement, and through it its thread slot: withdrawn when the
    /// guard is dropped, after `finish` has handed everything to the advancer.
    announcement: RefCell<OpAnnouncement<'h>>,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for OpGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpGuard")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl<'h> OpGuard<'h> {
    #[inline]
    pub(crate) fn begin(runtime: &'h Runtime) -> Result<OpGuard<'h>> {
        // In the thread's owned slot, `announce` refuses a nested operation itself.
        let announcement = runtime.epochs.announce()?;
        if !announcement.owned() {
            begin_shared(runtime.epochs.instance())?;
        }
        Ok(OpGuard {
            runtime,
            epoch: announcement.epoch(),
            log: RefCell::new(None),
            first_alloc: Kept::default(),
            first_victim: Kept::default(),
            first_deletion: KeptDeletion::default(),
            announcement: RefCell::new(announcement),
            _not_send: PhantomData,
        })
    }

    /// The operation's log: taken from the slot's spares at its first use (a fresh one if
    /// there is none), so that an operation that logs nothing never touches one.
    fn log(&self) -> RefMut<'_, OpLog> {
        RefMut::map(self.log.borrow_mut(), |log| {
            &mut **log.get_or_insert_with(|| self.spare_log())
        })
    }

    /// A log from the slot's spares, or a fresh one if there is none.
    fn spare_log(&self) -> Box<OpLog> {
        self.announcement
            .borrow_mut()
            .state(|state| state.spare_logs.pop())
            .unwrap_or_default()
    }

    /// The epoch this operation runs in.
    #[inline]
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Checks an epoch stamp the data structure keeps in DRAM beside state that payloads do
    /// not carry (for example the absence of a key after a delete): fails with
    /// [`Error::Aborted`] if `stamp` is newer than this operation's epoch.
    ///
    /// An operation must never act on an effect of an operation of a newer epoch: recovery
    /// could keep this operation and lose the other. Payload accesses check this themselves;
    /// a structure stamps everything else it protects (a bucket, a lock) with the epoch of
    /// the last operation that changed it, and checks the stamp here before acting on it.
    ///
    /// # Errors
    ///
    /// [`Error::Aborted`] when `stamp > self.epoch()`.
    pub fn check_epoch(&self, stamp: Epoch) -> Result<()> {
        if stamp > self.epoch {
            Err(Error::Aborted)
        } else {
            Ok(())
        }
    }

    /// Allocates a payload holding `bytes`, owned by `owner`, of type `type_id`, with a fresh
    /// uid.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfSpace`] when the heap is full; [`Error::ReadOnly`] on a heap opened
    /// read-only.
    pub fn alloc(&self, owner: OwnerId, type_id: u64, bytes: &[u8]) -> Result<PBlock> {
        let shared = self.runtime;
        shared.writable()?;
        let spec = BlockSpec {
            kind: BlockKind::Alloc,
            epoch: self.epoch,
            uid: fresh_uid(&shared.epochs),
            type_id,
            owner,
        };
        self.alloc_spec(spec, bytes)
    }

    /// Allocates a block of `spec` holding `bytes`: most allocations take a block from the
    /// thread's cache, written whole at once, and log its write-back in the slot's log of the
    /// epoch, the cache and the log taken from the slot in one step (see `log_persist`);
    /// the rest go out of line ([`alloc_spec_cold`](Self::alloc_spec_cold)), so that the
    /// common path keeps its registers.
    #[inline]
    fn alloc_spec(&self, spec: BlockSpec, bytes: &[u8]) -> Result<PBlock> {
        let shared = self.runtime;
        if shared.write_back == WriteBack::MeasureEachOp {
            return self.alloc_spec_cold(spec, bytes);
        }
        let cached = self
            .announcement
            .borrow_mut()
            .state_and_log(|state, bucket| {
                let block =
                    shared
                        .alloc
                        .fill_cached(&shared.media, &mut state.cache, spec, bytes)?;
                if let Some(block) = block {
                    bucket.persist.push(new_range(block, bytes.len() as u64));
                }
                Ok::<_, Error>(block)
            })?;
        match cached {
            Some(block) => {
                self.keep(&self.first_alloc, block, |log| &mut log.allocated);
                Ok(block)
            }
            None => self.alloc_spec_cold(spec, bytes),
        }
    }

    /// [`alloc_spec`](Self::alloc_spec) where it does not take the common path: each
    /// operation flushes its own writes ([`WriteBack::MeasureEachOp`], whose ranges
    /// `log_persist` handles), or the cache holds no block for the payload (it is empty, or
    /// the payload needs a large block). `alloc_whole` takes the block from the thread's
    /// cache when it has one, refilling it otherwise.
    #[cold]
    #[inline(never)]
    fn alloc_spec_cold(&self, spec: BlockSpec, bytes: &[u8]) -> Result<PBlock> {
        let shared = self.runtime;
        // Written whole, the meta word last (INV-READ-1).
        let block = shared
            .alloc
            .alloc_whole(&shared.media, &self.announcement, spec, bytes)?;
        self.log_new(block, bytes.len() as u64);
        Ok(block)
    }

    /// Writes `bytes` as `block`'s payload, and their checksum into its trailer.
    fn fill(&self, block: PBlock, bytes: &[u8]) -> Result<()> {
        let shared = self.runtime;
        // The bytes are in hand (and in this core's cache): their checksum costs least now.
        shared.alloc.write_payload(&shared.media, block, bytes)
    }

    /// The header of `block`, checked against this operation's epoch.
    ///
    /// # Errors
    ///
    /// [`Error::Aborted`] if the block was written in a newer epoch;
    /// [`Error::InvalidBlock`] if it is not a live block.
    pub fn info(&self, block: PBlock) -> Result<BlockInfo> {
        let info = self.runtime.alloc.header(&self.runtime.media, block)?;
        self.in_epoch(info)
    }

    /// [`info`](Self::info) for a caller about to read the payload (see
    /// `Allocator::header_for_read`).
    pub(crate) fn info_for_read(&self, block: PBlock) -> Result<BlockInfo> {
        self.info_and_meta_for_read(block).map(|(info, _)| info)
    }

    /// [`info_for_read`](Self::info_for_read), with the meta word the header was read with.
    #[inline]
    fn info_and_meta_for_read(&self, block: PBlock) -> Result<(BlockInfo, u64)> {
        let (info, meta) = self
            .runtime
            .alloc
            .header_for_read(&self.runtime.media, block)?;
        Ok((self.in_epoch(info)?, meta))
    }

    /// `info`, unless its block was written in a newer epoch than this operation's.
    fn in_epoch(&self, info: BlockInfo) -> Result<BlockInfo> {
        if info.spec.epoch > self.epoch {
            return Err(Error::Aborted);
        }
        Ok(info)
    }

    /// `block`'s header, checked as [`info`](Self::info) checks it, with a reader of its
    /// payload: one check for several reads of parts of the payload.
    ///
    /// # Errors
    ///
    /// As [`info`](Self::info).
    pub fn view(&self, block: PBlock) -> Result<BlockView<'h>> {
        let (info, meta) = self.info_and_meta_for_read(block)?;
        self.runtime
            .verify_payload(&info, || self.epoch.durable_cut())?;
        Ok(BlockView::new(info, &self.runtime.media, meta).taken_by_op())
    }

    /// The payload of `block`.
    ///
    /// # Errors
    ///
    /// As [`info`](Self::info).
    pub fn read(&self, block: PBlock) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_into(block, &mut buf)?;
        Ok(buf)
    }

    /// [`read`](Self::read) into `buf` (resized to the payload's length), so that a caller
    /// with a buffer of its own allocates nothing.
    ///
    /// # Errors
    ///
    /// As [`info`](Self::info).
    pub fn read_into(&self, block: PBlock, buf: &mut Vec<u8>) -> Result<()> {
        let info = self.info_for_read(block)?;
        self.runtime
            .verify_payload(&info, || self.epoch.durable_cut())?;
        buf.resize(info.len as usize, 0);
        // `info` validated the block and its length against its capacity.
        self.runtime.media.read(block.payload_offset(), buf)
    }

    /// Replaces `block`'s payload with `bytes` and returns the handle to use from now on: the
    /// same block when it was written in this epoch and `bytes` fits, otherwise a new copy
    /// with the same uid (the old one is retired).
    ///
    /// # Errors
    ///
    /// As [`info`](Self::info); [`Error::Retired`] if another operation already superseded
    /// or deleted it; [`Error::OutOfSpace`]; [`Error::ReadOnly`] on a heap opened read-only.
    pub fn update(&self, block: PBlock, bytes: &[u8]) -> Result<PBlock> {
        self.update_replacing(block, bytes).map(|(new, _)| new)
    }

    /// [`update`](Self::update), also returning the header `block` had before the write
    /// (its length, its epoch), which the update reads anyway: for a caller that accounts
    /// for what it replaces (a cache's byte count) without reading the header a second time.
    ///
    /// # Errors
    ///
    /// As [`update`](Self::update).
    #[inline]
    pub fn update_replacing(&self, block: PBlock, bytes: &[u8]) -> Result<(PBlock, BlockInfo)> {
        let shared = self.runtime;
        shared.writable()?;
        let len = bytes.len() as u64;
        // Where updates write new versions (blocks of older epochs: a large working set),
        // the old header is a cache miss: ask for its line and fill a new block while it
        // comes, so that the miss overlaps those stores instead of preceding them (the new
        // header, written last, needs the old one's uid). Where they write in place (a hot
        // set, rewritten within an epoch), the header is in cache and a filled block would be
        // thrown away, so the thread's recent updates decide.
        let versions = NEW_VERSIONS.get();
        let filled = if versions >= 2 {
            shared.media.prefetch_for_write(block.offset(), HEADER_LEN);
            self.filled_block(bytes)
        } else {
            None
        };
        let info = match self.info(block) {
            Ok(info) => info,
            Err(err) => {
                self.put_back(filled);
                return Err(err);
            }
        };
        let in_place = self.fits_in_place(&info, len);
        count_version(versions, in_place);
        if !in_place {
            let new = match filled {
                Some(new) => NewVersion::Filled(new, len),
                None => NewVersion::Bytes(bytes),
            };
            let new = self.supersede(&info, self.version_kind(&info), new)?;
            return Ok((new, info));
        }
        self.put_back(filled);
        Ok((self.overwrite_in_place(&info, bytes)?, info))
    }

    /// Updates the block `view` shows, as [`update`](Self::update) does, without reading its
    /// header again when `view` came from [`view`](Self::view) of an operation of this heap
    /// and the block's header has not changed since (see
    /// [`delete_viewed`](Self::delete_viewed)): for a write that returns the value it
    /// replaces. Any other view takes `update`'s path with the block `view.info().block`.
    ///
    /// # Errors
    ///
    /// As [`update`](Self::update).
    pub fn update_viewed(&self, view: &BlockView<'_>, bytes: &[u8]) -> Result<PBlock> {
        let block = view.info().block;
        let Some((info, seen)) = self.viewed(view)? else {
            return self.update(block, bytes);
        };
        let in_place = self.fits_in_place(&info, bytes.len() as u64);
        // In place, if the header is still the one the view read (its line is in cache).
        if in_place && self.runtime.media.load(block.offset())? != seen {
            return self.update(block, bytes);
        }
        if !in_place && !self.claim(block, Some(seen))? {
            return self.update(block, bytes);
        }
        count_version(NEW_VERSIONS.get(), in_place);
        if in_place {
            return self.overwrite_in_place(&info, bytes);
        }
        self.supersede_claimed(&info, self.version_kind(&info), NewVersion::Bytes(bytes))
    }

    /// The header `view` read, checked against this operation's epoch, with the meta word it
    /// was read with, for the writes that take a view (`delete_viewed`, `update_viewed`):
    /// `None` for a view that was not taken by an operation of this heap (the write reads the
    /// header itself then).
    fn viewed(&self, view: &BlockView<'_>) -> Result<Option<(BlockInfo, u64)>> {
        let Some(seen) = view.meta_of(&self.runtime.media) else {
            return Ok(None);
        };
        self.runtime.writable()?;
        Ok(Some((self.in_epoch(*view.info())?, seen)))
    }

    /// Whether an update of the block `info` describes to `len` bytes writes in place: the
    /// block was written in this epoch and has room.
    fn fits_in_place(&self, info: &BlockInfo, len: u64) -> bool {
        info.spec.epoch == self.epoch && len <= info.capacity
    }

    /// Writes `bytes` over the payload of the block `info` describes, which this operation
    /// wrote and which has room for them (`update`'s in-place case).
    fn overwrite_in_place(&self, info: &BlockInfo, bytes: &[u8]) -> Result<PBlock> {
        let shared = self.runtime;
        let block = info.block;
        let len = bytes.len() as u64;
        // The payload and its trailer in one pass (the bytes are in hand, and in this core's
        // cache), then a header of the new length: all of this epoch, written back with it.
        shared.alloc.write_payload(&shared.media, block, bytes)?;
        if len != u64::from(info.len) {
            let header = info.spec.raw(len as u32);
            shared
                .alloc
                .write_header(&shared.media, block.offset(), &header)?;
        }
        self.log_persist(block.offset(), HEADER_LEN + len + TRAILER_LEN);
        Ok(block)
    }

    /// Writes a new version of `block`'s payload holding `bytes` to a new block with the
    /// same uid, and retires `block`, even when `block` was written in this epoch: for
    /// structures that publish the new version with a swap instead of under a lock, so that
    /// readers of the old handle never see a half-written payload. (A superseded block of
    /// this epoch becomes invalid when the operation ends; one of an older epoch stays
    /// readable until it is reclaimed.)
    ///
    /// # Errors
    ///
    /// As [`update`](Self::update); [`Error::Retired`] is how a concurrent replacement of
    /// the same block shows.
    pub fn copy_update(&self, block: PBlock, bytes: &[u8]) -> Result<PBlock> {
        self.copy_update_replacing(block, bytes).map(|(new, _)| new)
    }

    /// [`copy_update`](Self::copy_update), also returning the header `block` had, as
    /// [`update_replacing`](Self::update_replacing) does.
    ///
    /// # Errors
    ///
    /// As [`copy_update`](Self::copy_update).
    pub fn copy_update_replacing(
        &self,
        block: PBlock,
        bytes: &[u8],
    ) -> Result<(PBlock, BlockInfo)> {
        self.runtime.writable()?;
        let info = self.info(block)?;
        Ok((self.replace(&info, bytes)?, info))
    }

    /// Writes `bytes` at byte `at` of `block`'s payload (inside its current length) and
    /// returns the handle to use from now on, as [`update`](Self::update) does.
    ///
    /// # Errors
    ///
    /// As [`update`](Self::update); [`Error::OutOfBounds`] if the range leaves the payload.
    pub fn write(&self, block: PBlock, at: u64, bytes: &[u8]) -> Result<PBlock> {
        let info = self.info(block)?;
        self.write_checked(&info, at, bytes)
    }

    /// [`write`](Self::write) for a block whose header `info` was read by
    /// [`info`](Self::info) in this operation.
    pub(crate) fn write_checked(&self, info: &BlockInfo, at: u64, bytes: &[u8]) -> Result<PBlock> {
        let block = info.block;
        if info.spec.epoch == self.epoch {
            // Inside the recorded length, which `info` checked against the capacity.
            self.write_in_place(&mut InPlace::found(info), at, bytes)?;
            return Ok(block);
        }
        self.runtime.writable()?;
        let len = bytes.len() as u64;
        if at
            .checked_add(len)
            .is_none_or(|end| end > u64::from(info.len))
        {
            return Err(Error::OutOfBounds { offset: at, len });
        }
        let mut payload = vec![0u8; info.len as usize];
        self.runtime
            .media
            .read(block.payload_offset(), &mut payload)?;
        payload[at as usize..(at + len) as usize].copy_from_slice(bytes);
        self.replace(info, &payload)
    }

    /// Finds `block`, written in this operation's epoch, for writes in place by this and
    /// later operations of the same epoch ([`write_in_place`](Self::write_in_place)) without
    /// reading its header again: for a structure that appends to a block through an epoch
    /// (a log page).
    ///
    /// # Errors
    ///
    /// As [`info`](Self::info); [`Error::Unsupported`] if the block is of an older epoch
    /// (only a block of the operation's own epoch may change in place: write a new block).
    pub fn in_place(&self, block: PBlock) -> Result<InPlace> {
        let info = self.info(block)?;
        if info.spec.epoch != self.epoch {
            return Err(older_epoch());
        }
        Ok(InPlace::found(&info))
    }

    /// Writes `bytes` at byte `at` of the payload of `target`'s block, in place: as
    /// [`write`](Self::write) does for a block of this epoch, with the header read once, by
    /// [`in_place`](Self::in_place). The block's checksum is written again when its epoch is
    /// written back, as for every change in place.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] if `target` was found in another epoch (the caller writes a
    /// new block); [`Error::OutOfBounds`] if the range leaves the payload;
    /// [`Error::ReadOnly`] on a heap opened read-only.
    #[inline]
    pub fn write_in_place(&self, target: &mut InPlace, at: u64, bytes: &[u8]) -> Result<()> {
        self.runtime.writable()?;
        if target.epoch != self.epoch {
            return Err(older_epoch());
        }
        let len = bytes.len() as u64;
        if at.checked_add(len).is_none_or(|end| end > target.len) {
            return Err(Error::OutOfBounds { offset: at, len });
        }
        let offset = target.block.payload_offset() + at;
        self.runtime.media.write(offset, bytes)?;
        // Once per block and epoch: the reseal covers this operation's writes and every
        // later one's in the epoch (an aborted operation's log is handed over too).
        self.record_in_place(target.block, offset, len, !target.resealed);
        target.resealed = true;
        Ok(())
    }

    /// Records that this operation wrote `len` bytes at `offset` in place, inside `block`'s
    /// payload, to be written back with its epoch, and the block's checksum written again.
    pub(crate) fn record_write(&self, block: PBlock, offset: u64, len: u64) {
        self.record_in_place(block, offset, len, true);
    }

    /// [`record_write`](Self::record_write), logging `block` for its reseal only if
    /// `reseal` (a caller that knows an operation of this epoch logged it passes `false`).
    /// The advance reseals a block once every operation of its epoch has ended and writes
    /// the whole block back with its new checksum (INV-SUM-1), so a write in place logs no
    /// range of its own, but where each operation flushes its own writes
    /// ([`WriteBack::MeasureEachOp`]).
    fn record_in_place(&self, block: PBlock, offset: u64, len: u64, reseal: bool) {
        if self.runtime.write_back == WriteBack::MeasureEachOp {
            // Durable when the operation ends.
            self.log().persist.push((offset, len));
        }
        if reseal {
            let mut log = self.log();
            if log.resealed.last() != Some(&block) {
                log.resealed.push(block);
            }
        }
    }

    /// What this operation runs on.
    pub(crate) fn runtime(&self) -> &'h Runtime {
        self.runtime
    }

    /// Runs `f` only if the clock still reads this operation's epoch, and keeps the clock
    /// from moving on until `f` returns (INV-EP-4): `None`, once the clock has moved past
    /// the operation's epoch, if an advance had begun.
    pub(crate) fn verified<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        self.announcement.borrow().verify(f)
    }

    /// Whether the operation is announced in a thread slot its thread owns (else in a
    /// shared one).
    #[cfg(test)]
    pub(crate) fn in_owned_slot(&self) -> bool {
        self.announcement.borrow().owned()
    }

    /// The instance id of the heap the operation belongs to (unique in the process).
    #[inline]
    pub(crate) fn heap_instance(&self) -> u64 {
        self.runtime.epochs.instance()
    }

    /// Runs `f` on the thread slot's cache of the lock-free queue's nodes, with the
    /// operation's epoch, which its rule reads (INV-NODE-1).
    #[inline]
    #[cfg_attr(montage_loom, allow(dead_code))] // the queue leaks its nodes under loom
    pub(crate) fn nodes<R>(&self, f: impl FnOnce(&mut NodeCache, Epoch) -> R) -> R {
        let epoch = self.epoch;
        self.announcement
            .borrow_mut()
            .state(|state| f(&mut state.nodes, epoch))
    }

    /// The id of the operation's thread, held while the operation runs (`None` in thread
    /// teardown): `verified/atomic.rs` finds the thread's swap descriptor by it.
    #[inline]
    pub(crate) fn thread_id(&self) -> Option<usize> {
        self.announcement.borrow().thread_id()
    }

    /// Checks that `type_id` may be stored under `name` in this heap, registering it the
    /// first time (a per-thread cache makes repeated checks cheap).
    pub(crate) fn ensure_type(&self, name: &'static str, type_id: u64) -> Result<()> {
        let instance = self.runtime.epochs.instance();
        // During thread teardown the cache may be gone already: the registry answers then.
        let known = LOCAL
            .try_with(|local| local.borrow().types.contains(&(instance, type_id)))
            .unwrap_or(false);
        if known {
            return Ok(());
        }
        self.runtime.check_type(name, type_id)?;
        let _ = LOCAL.try_with(|local| {
            let mut local = local.borrow_mut();
            // Entries of heaps this thread no longer uses are dropped wholesale now and then.
            if local.types.len() >= TYPE_CACHE {
                local.types.clear();
            }
            local.types.push((instance, type_id));
        });
        Ok(())
    }

    /// Copy-on-write: a new block with `info`'s uid holding `bytes`; the old one retired.
    fn replace(&self, info: &BlockInfo, bytes: &[u8]) -> Result<PBlock> {
        self.supersede(info, self.version_kind(info), NewVersion::Bytes(bytes))
    }

    /// The kind of a new version of `info`'s block.
    fn version_kind(&self, info: &BlockInfo) -> BlockKind {
        if info.spec.epoch == self.epoch {
            // A block of this epoch has no older version unless it is an update itself.
            info.spec.kind
        } else {
            BlockKind::Update
        }
    }

    /// A small block holding `bytes` and their checksum but no header yet (see
    /// `Allocator::take_small`), or `None` (a large payload, no block at hand, or a failed
    /// write, which the caller's ordinary path meets again and reports).
    fn filled_block(&self, bytes: &[u8]) -> Option<PBlock> {
        let shared = self.runtime;
        let block =
            shared
                .alloc
                .take_small(&shared.media, &self.announcement, bytes.len() as u64)?;
        if self.fill(block, bytes).is_err() {
            shared.alloc.put_back(&self.announcement, block);
            return None;
        }
        Some(block)
    }

    /// Returns an unused block from [`filled_block`](Self::filled_block).
    fn put_back(&self, filled: Option<PBlock>) {
        if let Some(block) = filled {
            self.runtime.alloc.put_back(&self.announcement, block);
        }
    }

    /// Logs a block this operation allocated, holding `len` payload bytes: killed if the
    /// operation aborts, written back with its epoch.
    fn log_new(&self, block: PBlock, len: u64) {
        self.keep(&self.first_alloc, block, |log| &mut log.allocated);
        let (offset, len) = new_range(block, len);
        self.log_persist(offset, len);
    }

    /// Records that this operation wrote the `len` bytes at `offset`, to be written back
    /// with its epoch. They go straight into the slot's log of the epoch, which the advancer
    /// takes only once the operation has left (INV-SLOT-1), so the operation's end has
    /// nothing to hand over for them; an aborted operation's ranges are written back too,
    /// which is harmless (its allocations are killed, and the killing header is one of
    /// them). Where each operation flushes its own writes
    /// ([`WriteBack::MeasureEachOp`]), they stay with the operation until it ends.
    fn log_persist(&self, offset: u64, len: u64) {
        if self.runtime.write_back == WriteBack::MeasureEachOp {
            self.log().persist.push((offset, len));
        } else {
            self.announcement
                .borrow_mut()
                .log(|bucket| bucket.persist.push((offset, len)));
        }
    }

    /// Logs `old`, superseded by this operation: killed at commit if it is of this epoch,
    /// reclaimed as an old version otherwise.
    fn log_superseded(&self, old: &BlockInfo) {
        if old.spec.epoch == self.epoch {
            self.log().kills.push(old.block);
        } else {
            self.keep(&self.first_victim, old.block, |log| &mut log.victims);
        }
    }

    /// Keeps `block` in the guard's cell `first` if it is empty, and otherwise in the list
    /// of the log that `rest` picks: the first of each kind stays out of the log, so that
    /// an operation with one of each takes none.
    fn keep(&self, first: &Kept, block: PBlock, rest: impl FnOnce(&mut OpLog) -> &mut Vec<PBlock>) {
        if first.get().is_none() {
            first.set(block);
        } else {
            rest(&mut self.log()).push(block);
        }
    }

    /// Retires `old` and writes a block of `kind` with its uid, type and owner in this epoch
    /// holding `new`. The old block is killed at commit if it is of this epoch, and
    /// reclaimed as a superseded version otherwise; if the write fails, the retirement is
    /// undone, and if the retirement fails, a filled block goes back unused.
    fn supersede(&self, old: &BlockInfo, kind: BlockKind, new: NewVersion<'_>) -> Result<PBlock> {
        let shared = self.runtime;
        if let Err(err) = shared.alloc.mark_retired(&shared.media, old.block) {
            if let NewVersion::Filled(block, _) = new {
                self.put_back(Some(block));
            }
            return Err(err);
        }
        self.supersede_claimed(old, kind, new)
    }

    /// [`supersede`](Self::supersede) once `old` is retired (by this call's caller).
    fn supersede_claimed(
        &self,
        old: &BlockInfo,
        kind: BlockKind,
        new: NewVersion<'_>,
    ) -> Result<PBlock> {
        let shared = self.runtime;
        let spec = BlockSpec {
            kind,
            epoch: self.epoch,
            ..old.spec
        };
        let written = match new {
            NewVersion::Bytes(bytes) => self.alloc_spec(spec, bytes),
            NewVersion::Filled(block, len) => {
                // Its payload and trailer are written: log it, then its header makes it whole.
                self.log_new(block, len);
                shared
                    .alloc
                    .write_header(&shared.media, block.offset(), &spec.raw(len as u32))
                    .map(|()| block)
            }
        };
        match written {
            Ok(block) => {
                self.log_superseded(old);
                Ok(block)
            }
            Err(err) => {
                shared.alloc.clear_retired(&shared.media, old.block)?;
                Err(err)
            }
        }
    }

    /// Deletes `block`'s payload: an anti-block records the deletion (unless the payload was
    /// first created in this epoch, when invalidating it is enough) and the block is retired.
    ///
    /// # Errors
    ///
    /// As [`update`](Self::update).
    pub fn delete(&self, block: PBlock) -> Result<()> {
        self.delete_as(block, Reach::Shared)
    }

    /// Deletes `block`'s payload as [`delete`](Self::delete) does, for a caller that
    /// promises that no one acts on the block after this operation ends: every reader of it
    /// holds a lock this operation holds while it deletes (a striped map's readers hold the
    /// key's stripe), or, for a reader that may still reach it, reads it inside an
    /// operation that will fail and roll back, whatever it read, and that changes the block
    /// only through a view it took ([`delete_viewed_unshared`](Self::delete_viewed_unshared),
    /// which refuses a block changed since; a nonblocking queue's dequeuer that lost the
    /// race for the head). A block written in this operation's epoch then goes straight back
    /// to this thread's cache when the operation commits, still in the processor's cache,
    /// instead of three epochs later with the other freed blocks (see `docs/design.md`,
    /// INV-ALLOC-1, for why no crash can miss it). Any other structure (a nonblocking map,
    /// whose readers return what they read) must use `delete`: a reader could find the
    /// block handed out again.
    ///
    /// # Errors
    ///
    /// As [`delete`](Self::delete).
    pub fn delete_unshared(&self, block: PBlock) -> Result<()> {
        self.delete_as(block, Reach::Unshared)
    }

    fn delete_as(&self, block: PBlock, reach: Reach) -> Result<()> {
        self.runtime.writable()?;
        let info = self.info(block)?;
        let deleted = self.delete_known(&info, None, reach)?;
        debug_assert!(deleted, "a claim without a seen meta word is never stale");
        Ok(())
    }

    /// Deletes the block `view` shows, as [`delete`](Self::delete) does, without reading
    /// its header again when `view` came from [`view`](Self::view) of an operation of this
    /// heap and the block's header has not changed since: for a structure that reads a
    /// payload and then deletes it (a queue's pop, a removal that returns the value). Any
    /// other view (a changed block, a view of another heap, a scan's) takes `delete`'s path
    /// with the block `view.info().block`.
    ///
    /// # Errors
    ///
    /// As [`delete`](Self::delete).
    pub fn delete_viewed(&self, view: &BlockView<'_>) -> Result<()> {
        self.delete_viewed_as(view, Reach::Shared)
    }

    /// [`delete_viewed`](Self::delete_viewed) with the promise of
    /// [`delete_unshared`](Self::delete_unshared), and its reuse. Unlike `delete_viewed`, a
    /// view this operation took of a block whose header changed since is refused with
    /// [`Error::Aborted`], claiming nothing: a reader that lost a race may hold a view of a
    /// block handed out again to another payload.
    ///
    /// # Errors
    ///
    /// As [`delete`](Self::delete); [`Error::Aborted`] for a view of a block changed since.
    pub fn delete_viewed_unshared(&self, view: &BlockView<'_>) -> Result<()> {
        self.delete_viewed_as(view, Reach::Unshared)
    }

    fn delete_viewed_as(&self, view: &BlockView<'_>, reach: Reach) -> Result<()> {
        if let Some((info, seen)) = self.viewed(view)? {
            if self.delete_known(&info, Some(seen), reach)? {
                return Ok(());
            }
            if reach == Reach::Unshared {
                // The block changed since this operation viewed it: under the caller's lock
                // that cannot happen, so the caller is a reader that lost a race, and the
                // block may be another payload now. Claim nothing; run again.
                return Err(Error::Aborted);
            }
        }
        self.delete_as(view.info().block, reach)
    }

    /// [`delete`](Self::delete) of the block whose header is `info`, read by this operation
    /// (with the meta word `seen`, if given: then `Ok(false)`, changing nothing, when the
    /// block's meta word is no longer that); `reach` says who else may reach it.
    fn delete_known(&self, info: &BlockInfo, seen: Option<u64>, reach: Reach) -> Result<bool> {
        if !self.claim(info.block, seen)? {
            return Ok(false);
        }
        let deletion = if info.spec.epoch == self.epoch && info.spec.kind == BlockKind::Alloc {
            Deletion::Kill(info.block, reach)
        } else {
            Deletion::Anti(self.supersede_claimed(
                info,
                BlockKind::Delete,
                NewVersion::Bytes(&[]),
            )?)
        };
        // As `keep` keeps a block: the first in the guard, the rest in the log.
        if self.first_deletion.is_empty() {
            self.first_deletion.set(deletion);
        } else {
            self.log().deleted(Some(deletion));
        }
        Ok(true)
    }

    /// Sets `block`'s retired bit, from its current meta word, or only from `seen` if given
    /// (`Ok(false)` if the word is no longer that). The meta word carries the header's
    /// checksum, which covers the uid, and the epoch's low 20 bits, so an unchanged word is
    /// the header that was read: the block cannot have been reused for another payload in
    /// between unless a million epochs passed and two checksums collided.
    ///
    /// # Errors
    ///
    /// [`Error::Retired`] if another operation retired it; [`Error::InvalidBlock`].
    fn claim(&self, block: PBlock, seen: Option<u64>) -> Result<bool> {
        let shared = self.runtime;
        match seen {
            None => shared
                .alloc
                .mark_retired(&shared.media, block)
                .map(|()| true),
            Some(seen) => Allocator::mark_retired_seen(&shared.media, block, seen),
        }
    }

    /// Deletes `block` without recording the deletion: the block is retired now and
    /// reclaimed as a replaced version is (two epochs on, once that is safe), but no
    /// anti-block is written, so a crash before its reclamation is durable may bring it back
    /// as it was. For a structure that knows such a payload is dead from what it holds (a
    /// log record older than the snapshot that covers it): it saves the anti-block's
    /// allocation, write-back and reclamation.
    ///
    /// # Errors
    ///
    /// As [`delete`](Self::delete).
    pub fn discard(&self, block: PBlock) -> Result<()> {
        self.runtime.writable()?;
        let info = self.info(block)?;
        let shared = self.runtime;
        shared.alloc.mark_retired(&shared.media, block)?;
        self.log_superseded(&info);
        Ok(())
    }

    /// Ends the operation without its effects: the blocks it allocated are invalidated and
    /// the blocks it retired are live again. Bytes it wrote in place are not restored.
    ///
    /// # Errors
    ///
    /// Only if the heap cannot be written (a poisoned heap).
    pub fn abort(self) -> Result<()> {
        let result = self.rollback();
        self.finish(false);
        result
    }

    fn rollback(&self) -> Result<()> {
        let shared = self.runtime;
        let mut log = self.log();
        let log = &mut *log;
        let mut first_error = Ok(());
        log.victims.extend(self.first_victim.take());
        // A first anti-block is dropped with the others (its allocation is killed below).
        log.deleted(
            self.first_deletion
                .take()
                .filter(|d| matches!(d, Deletion::Kill(..))),
        );
        let retired = log
            .victims
            .drain(..)
            .chain(log.kills.drain(..))
            .chain(log.reusable.drain(..));
        for block in retired {
            let result = shared.alloc.clear_retired(&shared.media, block);
            first_error = first_error.and(result);
        }
        log.antis.clear();
        // What this operation allocated was never part of any committed state: kill it, so
        // that the zeroed header is written back with this epoch and the block is reused
        // once that is durable (INV-EP-3).
        log.kills.extend(self.first_alloc.take());
        log.kills.append(&mut log.allocated);
        first_error
    }

    /// Commits (or, after `rollback`, just ends): kills, then hands everything to the
    /// advancer and withdraws the announcement; `committed` records the epoch as the
    /// thread's last commit.
    fn finish(&self, committed: bool) {
        if self.first_alloc.finish() {
            return;
        }
        let taken = self.log.borrow_mut().take();
        if taken.is_some() || !(self.first_victim.is_empty() && self.first_deletion.is_empty()) {
            self.hand_over_taken(taken);
        }
        let instance = self.runtime.epochs.instance();
        if !self.announcement.borrow().owned() {
            end_shared(instance);
        }
        if committed {
            LAST_COMMIT.set((instance, self.epoch));
        }
    }

    /// What `finish` does with the operation's log (`taken`, if it took one) and the blocks
    /// the guard kept out of it (its first victim and its first deletion): hands them to the
    /// advancer. Out of line: most operations have neither (an allocation's log entry is in
    /// the slot's log already), and their end should not pay for this path's registers.
    #[inline(never)]
    fn hand_over_taken(&self, taken: Option<Box<OpLog>>) {
        let first_victim = self.first_victim.take();
        let first_deletion = self.first_deletion.take();
        // Where each operation flushes its own writes, a kill's range is flushed with the
        // rest in `hand_over`: it needs a log then.
        let flushes = self.runtime.write_back == WriteBack::MeasureEachOp;
        let kills = matches!(first_deletion, Some(Deletion::Kill(..)));
        if taken.is_none() && !(flushes && kills) {
            // As `hand_over` would, without a log: the kill first, then everything to the
            // slot's log of this epoch before the announcement is withdrawn.
            let (mut range, mut victim, mut anti) = (None, None, None);
            match first_deletion {
                Some(Deletion::Kill(block, reach)) => (range, victim) = self.kill(block, reach),
                Some(Deletion::Anti(block)) => anti = Some(block),
                None => {}
            }
            self.announcement.borrow_mut().log(|bucket| {
                bucket.persist.extend(range);
                bucket
                    .victims
                    .extend(victim.into_iter().chain(first_victim));
                bucket.antis.extend(anti);
            });
            return;
        }
        let mut log = taken.unwrap_or_else(|| self.spare_log());
        log.victims.extend(first_victim);
        log.deleted(first_deletion);
        self.hand_over(&mut log);
        // What is left is capacity for the next operation in this slot.
        self.announcement
            .borrow_mut()
            .state(|state| state.spare_logs.push(log));
    }

    /// Invalidates `block`, which this operation deleted or superseded in its own epoch:
    /// returns the range of its header to write back (none if the store failed, which leaves
    /// the block valid until reclamation invalidates it; the heap is poisoned then and every
    /// later write reports it) and the block again if it waits for reclamation. A block
    /// no one else can reach (`Reach::Unshared`, INV-ALLOC-1's exception) goes back to the
    /// thread's cache at once if it is small.
    fn kill(&self, block: PBlock, reach: Reach) -> (Option<(u64, u64)>, Option<PBlock>) {
        let shared = self.runtime;
        let killed = shared.media.store(block.offset(), 0).is_ok();
        let reused =
            reach == Reach::Unshared && killed && shared.alloc.put_back(&self.announcement, block);
        (
            killed.then_some((block.offset(), 8)),
            (!reused).then_some(block),
        )
    }

    /// Kills what the operation killed and hands everything in `log` to the advancer,
    /// leaving it empty.
    fn hand_over(&self, log: &mut OpLog) {
        let shared = self.runtime;
        let kills = log.kills.drain(..).map(|block| (block, Reach::Shared));
        let reusable = log.reusable.drain(..).map(|block| (block, Reach::Unshared));
        for (block, reach) in kills.chain(reusable) {
            let (range, victim) = self.kill(block, reach);
            log.persist.extend(range);
            log.victims.extend(victim);
        }
        if shared.write_back == WriteBack::MeasureEachOp {
            // PERSIST: durable before the operation returns (WriteBack::MeasureEachOp). The ranges
            // still go to the advancer: they are how `sync` knows an epoch has writes to cover
            // (the advance finds the lines clean). A failure poisons the heap, and every later
            // write reports it.
            let _ = log
                .persist
                .iter()
                // PERSIST: as above.
                .try_for_each(|&(offset, len)| shared.media.flush(offset, len))
                // PERSIST: as above.
                .and_then(|()| shared.media.fence());
        }
        // Everything goes into the slot's log of this epoch before the announcement is
        // withdrawn (when the guard is dropped), so the advancer takes it with the epoch.
        // (Most ranges went there already, as they were written: see `log_persist`.)
        if !log.is_handed_over() {
            self.announcement.borrow_mut().log(|bucket| {
                bucket.take_from(
                    &mut log.persist,
                    &mut log.resealed,
                    &mut log.victims,
                    &mut log.antis,
                );
            });
        }
        log.allocated.clear();
        debug_assert!(log.is_handed_over());
    }
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        self.finish(true);
    }
}

/// Records an operation beginning in a shared slot of the heap with this instance id, or
/// refuses it if the thread has one open there already.
#[cold]
fn begin_shared(instance: u64) -> Result<()> {
    // During thread teardown the state may be gone already; nothing can nest then.
    LOCAL
        .try_with(|local| {
            let mut local = local.borrow_mut();
            if local.shared_active.contains(&instance) {
                return Err(Error::NestedOperation);
            }
            local.shared_active.push(instance);
            Ok(())
        })
        .unwrap_or(Ok(()))
}

/// Records the end of an operation that [`begin_shared`] recorded.
#[cold]
fn end_shared(instance: u64) {
    // During thread teardown the state may be gone already; nothing is left to track then.
    let _ = LOCAL.try_with(|local| {
        local
            .borrow_mut()
            .shared_active
            .retain(|&id| id != instance);
    });
}

/// What a new block holding `len` payload bytes has written, to be written back: its
/// header, the payload and the trailer.
#[inline]
fn new_range(block: PBlock, len: u64) -> (u64, u64) {
    (block.offset(), HEADER_LEN + len + TRAILER_LEN)
}

/// A fresh uid from the calling thread's reserved range, reserving a new range when it runs
/// out (or belongs to another heap).
#[inline]
fn fresh_uid(epochs: &super::Epochs) -> u64 {
    let instance = epochs.instance();
    let (owner, next, end) = UIDS.get();
    if owner == instance && next < end {
        UIDS.set((owner, next + 1, end));
        return next;
    }
    let first = epochs.reserve_uids(UID_BATCH);
    UIDS.set((instance, first + 1, first + UID_BATCH));
    first
}

/// The epoch of the last operation the calling thread committed on the heap with this
/// instance id, if any.
pub(crate) fn last_commit(instance: u64) -> Option<Epoch> {
    let (heap, epoch) = LAST_COMMIT.get();
    (heap == instance).then_some(epoch)
}

#[cfg(all(test, not(montage_loom)))]
mod tests {
    use crate::{EpochLength, Error, Heap, HeapConfig, OpGuard, PBlock, Result};

    /// A block found with `in_place` takes writes in place from every operation of its
    /// epoch, inside its payload only, and from none of a later epoch; a block of an older
    /// epoch cannot be found for them. What is written reaches the heap and, once the
    /// epoch is written back, a checksum that matches it.
    #[test]
    fn a_block_found_for_writes_in_place_takes_them_in_its_epoch_only() {
        let config = HeapConfig::in_memory(1 << 20)
            .epoch_length(EpochLength::Manual)
            .verify_reads(true);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("t").unwrap();
        let (block, mut target) = heap
            .run_op(|op| {
                let block = op.alloc(owner, 1, &[0; 24])?;
                let mut target = op.in_place(block)?;
                op.write_in_place(&mut target, 0, b"first")?;
                Ok((block, target))
            })
            .unwrap();
        assert_eq!((target.block(), target.len()), (block, 24));
        // A later operation of the same epoch, without reading the header again.
        heap.run_op(|op| op.write_in_place(&mut target, 16, b"second!!"))
            .unwrap();
        assert!(matches!(
            heap.run_op(|op| op.write_in_place(&mut target, 21, b"long")),
            Err(Error::OutOfBounds { offset: 21, len: 4 })
        ));
        let mut want = [0u8; 24];
        want[..5].copy_from_slice(b"first");
        want[16..].copy_from_slice(b"second!!");
        assert_eq!(heap.read_payload(block).unwrap(), want);
        // Written back with a checksum of what it holds: reads verify it once the clock is
        // two epochs past the block's.
        heap.sync().unwrap();
        heap.sync().unwrap();
        assert_eq!(heap.read_payload(block).unwrap(), want);
        // The epoch has moved on: neither the handle nor a new one takes writes (an error
        // that `run_op` does not retry).
        assert!(matches!(
            heap.run_op(|op| op.write_in_place(&mut target, 0, b"late")),
            Err(Error::Unsupported { .. })
        ));
        assert!(matches!(
            heap.run_op(|op| op.in_place(block)),
            Err(Error::Unsupported { .. })
        ));
        assert_eq!(heap.read_payload(block).unwrap(), want);
    }

    /// `delete_viewed` retires a block viewed in the same operation without reading its
    /// header again, whether the deletion kills it (written in this epoch) or writes an
    /// anti-block (an older one); a view whose block changed since it was taken, or one
    /// without a meta word (outside an operation), takes `delete`'s path and its errors.
    #[test]
    fn a_viewed_block_is_deleted_as_delete_would() {
        let heap = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let owner = heap.register("t").unwrap();
        // Written and deleted in one epoch: killed, its header gone at commit.
        let killed = heap
            .run_op(|op| {
                let block = op.alloc(owner, 1, b"one")?;
                op.delete_viewed(&op.view(block)?)?;
                Ok(block)
            })
            .unwrap();
        assert!(matches!(
            heap.read_payload(killed),
            Err(Error::InvalidBlock { .. })
        ));
        // Written in an older epoch: an anti-block, and the block retired.
        let old = heap.run_op(|op| op.alloc(owner, 1, b"two")).unwrap();
        heap.advance_epoch().unwrap();
        heap.run_op(|op| op.delete_viewed(&op.view(old)?)).unwrap();
        assert!(matches!(
            heap.run_op(|op| op.delete(old)),
            Err(Error::Retired { .. })
        ));
        // A view taken before another operation retired the block: the retired bit makes
        // the fast path fail, and `delete`'s path reports it.
        let shared = heap.run_op(|op| op.alloc(owner, 1, b"three")).unwrap();
        heap.advance_epoch().unwrap();
        let op = heap.begin_op().unwrap();
        let stale = op.view(shared).unwrap();
        drop(op);
        heap.run_op(|op| op.delete(shared)).unwrap();
        assert!(matches!(
            heap.run_op(|op| op.delete_viewed(&stale)),
            Err(Error::Retired { .. })
        ));
        // A view from outside an operation carries no meta word: `delete`'s path.
        let outside = heap.run_op(|op| op.alloc(owner, 1, b"four")).unwrap();
        let view = heap.view(outside).unwrap();
        heap.run_op(|op| op.delete_viewed(&view)).unwrap();
        assert!(matches!(
            heap.run_op(|op| op.delete(outside)),
            Err(Error::Retired { .. } | Error::InvalidBlock { .. })
        ));
    }

    /// `delete_unshared` of a block written in the same epoch gives it to the thread's next
    /// allocation of its class as soon as the deleting operation commits; of an older
    /// block, it writes an anti-block as `delete` does and the block waits for
    /// reclamation; rolled back, it leaves the block live and takes nothing back.
    #[test]
    fn a_block_deleted_unshared_in_its_own_epoch_is_reused_at_once() {
        use crate::EpochLength;
        let config = HeapConfig::in_memory(1 << 20).epoch_length(EpochLength::Manual);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("t").unwrap();
        let alloc = |bytes: &[u8]| heap.run_op(|op| op.alloc(owner, 1, bytes)).unwrap();
        // Written and deleted in one epoch, in two operations.
        let first = alloc(b"one");
        heap.run_op(|op| op.delete_unshared(first)).unwrap();
        assert!(matches!(
            heap.read_payload(first),
            Err(Error::InvalidBlock { .. })
        ));
        let next = alloc(b"two");
        assert_eq!(next, first, "the killed block is the next one handed out");
        assert_eq!(heap.read_payload(next).unwrap(), b"two");
        // `delete` of the same kind of block leaves it to reclamation.
        heap.run_op(|op| op.delete(next)).unwrap();
        assert_ne!(alloc(b"three"), next);
        // An older block: an anti-block, and the block not handed out again now.
        let old = alloc(b"old");
        heap.advance_epoch().unwrap();
        heap.run_op(|op| op.delete_unshared(old)).unwrap();
        assert!(matches!(
            heap.run_op(|op| op.delete(old)),
            Err(Error::Retired { .. })
        ));
        assert_ne!(alloc(b"four"), old);
        // Rolled back: the block stays live, and the next allocation is another block.
        let kept = alloc(b"kept");
        let op = heap.begin_op().unwrap();
        op.delete_unshared(kept).unwrap();
        op.abort().unwrap();
        assert_eq!(heap.read_payload(kept).unwrap(), b"kept");
        assert_ne!(alloc(b"five"), kept);
    }

    /// An operation that deletes several blocks of each kind (of its own epoch, unshared
    /// and shared; of an older one, with anti-blocks) keeps the first of each out of its
    /// log and the rest in it: rolled back, every block is live again; committed, every one
    /// is gone, the unshared ones are handed out again at once, and the rest wait for
    /// reclamation.
    #[test]
    fn several_deletes_of_each_kind_in_one_operation_commit_and_roll_back_alike() {
        let config = HeapConfig::in_memory(1 << 20).epoch_length(EpochLength::Manual);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("t").unwrap();
        let live_blocks = |heap: &Heap| -> u64 {
            let usage = heap.usage(|_| {}).unwrap();
            usage.classes.iter().map(|class| class.live_blocks).sum()
        };
        let at_start = live_blocks(&heap);
        let alloc = |bytes: &[u8]| heap.run_op(|op| op.alloc(owner, 1, bytes)).unwrap();
        let old: Vec<PBlock> = (0u8..3).map(|i| alloc(&[b'o', i])).collect();
        heap.advance_epoch().unwrap();
        let unshared: Vec<PBlock> = (0u8..3).map(|i| alloc(&[b'u', i])).collect();
        let shared: Vec<PBlock> = (0u8..2).map(|i| alloc(&[b's', i])).collect();
        // The first deletion a kill the guard keeps; the anti-blocks all in the log.
        let delete_all = |op: &OpGuard<'_>| -> Result<()> {
            for &block in &unshared {
                op.delete_unshared(block)?;
            }
            for &block in &old {
                op.delete(block)?;
            }
            for &block in &shared {
                op.delete(block)?;
            }
            Ok(())
        };
        let op = heap.begin_op().unwrap();
        delete_all(&op).unwrap();
        op.abort().unwrap();
        for (&block, want) in old.iter().zip([b"o\0", b"o\x01", b"o\x02"]) {
            assert_eq!(heap.read_payload(block).unwrap(), want);
        }
        for &block in unshared.iter().chain(&shared) {
            assert_eq!(heap.read_payload(block).unwrap().len(), 2);
        }
        heap.run_op(|op| delete_all(op)).unwrap();
        for &block in unshared.iter().chain(&shared) {
            assert!(matches!(
                heap.read_payload(block),
                Err(Error::InvalidBlock { .. })
            ));
        }
        for &block in &old {
            assert!(matches!(
                heap.run_op(|op| op.delete(block)),
                Err(Error::Retired { .. })
            ));
        }
        // The unshared blocks, the first kept by the guard and the others by the log, are
        // the next three handed out; the shared ones and the old ones are not.
        let mut next: Vec<PBlock> = (0u8..3).map(|i| alloc(&[b'n', i])).collect();
        let mut want = unshared.clone();
        next.sort_unstable();
        want.sort_unstable();
        assert_eq!(next, want);
        let later = alloc(b"later");
        assert!(!shared.contains(&later) && !old.contains(&later));
        // One deletion of each kind alone in its operation, which takes no log at all.
        let alone_old = alloc(b"alone, old");
        heap.advance_epoch().unwrap();
        let alone_shared = alloc(b"alone, shared");
        heap.run_op(|op| op.delete(alone_old)).unwrap();
        heap.run_op(|op| op.delete(alone_shared)).unwrap();
        assert!(matches!(
            heap.read_payload(alone_shared),
            Err(Error::InvalidBlock { .. })
        ));
        assert!(matches!(
            heap.run_op(|op| op.delete(alone_old)),
            Err(Error::Retired { .. })
        ));
        // Reclamation takes the rest, the anti-blocks included: what is left live is what
        // was before the test and the four blocks allocated since the deletions.
        for _ in 0..6 {
            heap.advance_epoch().unwrap();
        }
        assert_eq!(live_blocks(&heap), at_start + 4);
    }

    /// `update_viewed` writes in place or a new version as `update` would, from the view's
    /// header while it is still the block's, and takes `update`'s path once it is not.
    #[test]
    fn a_viewed_block_is_updated_as_update_would() {
        let heap = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let owner = heap.register("t").unwrap();
        // Written in this epoch: in place.
        let (first, again) = heap
            .run_op(|op| {
                let block = op.alloc(owner, 1, b"one")?;
                Ok((block, op.update_viewed(&op.view(block)?, b"uno")?))
            })
            .unwrap();
        assert_eq!(again, first);
        assert_eq!(heap.read_payload(first).unwrap(), b"uno");
        // Written in an older epoch: a new version, the old block retired.
        heap.advance_epoch().unwrap();
        let second = heap
            .run_op(|op| op.update_viewed(&op.view(first)?, b"eins"))
            .unwrap();
        assert_ne!(second, first);
        assert_eq!(heap.read_payload(second).unwrap(), b"eins");
        assert!(matches!(
            heap.run_op(|op| op.delete(first)),
            Err(Error::Retired { .. })
        ));
        // A view whose block was rewritten in place since, with another length (so another
        // header): the update goes by the header the block has now.
        let op = heap.begin_op().unwrap();
        let stale = op.view(second).unwrap();
        drop(op);
        heap.run_op(|op| op.update(second, b"ei")).unwrap();
        let third = heap.run_op(|op| op.update_viewed(&stale, b"eine")).unwrap();
        assert_eq!(third, second);
        assert_eq!(heap.read_payload(third).unwrap(), b"eine");
        // A view whose block was superseded since: `update`'s error.
        heap.advance_epoch().unwrap();
        let op = heap.begin_op().unwrap();
        let superseded = op.view(third).unwrap();
        drop(op);
        heap.run_op(|op| op.update(third, b"une")).unwrap();
        assert!(matches!(
            heap.run_op(|op| op.update_viewed(&superseded, b"one")),
            Err(Error::Retired { .. })
        ));
    }

    /// `update_replacing` and `copy_update_replacing` write as `update` and `copy_update`
    /// do and return the header the block had before: in place, as a new version, and
    /// as a copy; a failed update returns the error and writes nothing.
    #[test]
    fn an_update_reports_the_header_it_replaced() {
        let config = HeapConfig::in_memory(1 << 20).epoch_length(EpochLength::Manual);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("t").unwrap();
        let block = heap.run_op(|op| op.alloc(owner, 7, b"seven")).unwrap();
        let before = heap.run_op(|op| op.info(block)).unwrap();
        // Written in this epoch: in place, the old header (length 5) reported.
        let (same, replaced) = heap
            .run_op(|op| op.update_replacing(block, b"sieben!"))
            .unwrap();
        assert_eq!(same, block);
        assert_eq!(replaced, before);
        assert_eq!(heap.read_payload(block).unwrap(), b"sieben!");
        // Written in an older epoch: a new version; the header reported is the rewritten
        // one's (length 7), with its epoch.
        let rewritten = heap.run_op(|op| op.info(block)).unwrap();
        assert_eq!(rewritten.len, 7);
        heap.advance_epoch().unwrap();
        let (second, replaced) = heap.run_op(|op| op.update_replacing(block, b"7")).unwrap();
        assert_ne!(second, block);
        assert_eq!(replaced, rewritten);
        assert_eq!(heap.read_payload(second).unwrap(), b"7");
        // A copy in the same epoch: a new block, the old header reported.
        let current = heap.run_op(|op| op.info(second)).unwrap();
        let (third, replaced) = heap
            .run_op(|op| op.copy_update_replacing(second, b"sept"))
            .unwrap();
        assert_ne!(third, second);
        assert_eq!(replaced, current);
        assert_eq!(heap.read_payload(third).unwrap(), b"sept");
        // A block already superseded (in its own epoch: invalid once that operation ended):
        // `update`'s error, and the live version is unchanged.
        let err = heap.run_op(|op| op.update_replacing(second, b"late"));
        assert!(matches!(err, Err(Error::InvalidBlock { .. })), "{err:?}");
        assert!(matches!(
            heap.run_op(|op| op.update(second, b"late")),
            Err(Error::InvalidBlock { .. })
        ));
        assert_eq!(heap.read_payload(third).unwrap(), b"sept");
    }
}
