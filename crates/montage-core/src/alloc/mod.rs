//! The payload allocator (Ralloc's role): size classes carved from spans whose class is
//! persistent and written once per carving, per-thread free lists in DRAM, large blocks that
//! take whole spans, and a free path that durably invalidates a block's header before the
//! block can be handed out again.
//!
//! # Invariants (numbered as in `docs/design.md`)
//!
//! * INV-ALLOC-1: every block on a DRAM free list (a thread cache's `free`, a class pool) has
//!   a durably invalid header. A freed block first sits on its cache's `pending` list; it
//!   moves to `free` only after a flush of its header line and a fence by the same thread.
//! * INV-SPAN-1: before a span's table entry can become durable, the meta word of every
//!   block start of the new carving is durably zero; so recovery never parses stale bytes of
//!   an earlier carving as a header.
//! * INV-SPAN-2: a span's table entry is durable before any block in it is handed out, and a
//!   span goes back to the free-span pool only once its entry is durably zero again.
//!
//! # Spans given back while the heap runs
//!
//! A size-class span whose blocks are all free is worth more as a free span: a workload whose
//! value sizes shift would otherwise find the heap full of free blocks of the wrong class.
//! Recovery releases such spans at open; while the heap runs, an allocation that finds no
//! free span to carve sweeps the free lists first ([`Allocator::release_free_spans`]): it
//! moves the free blocks of its own cache and of the idle ones to the class pools, takes out
//! of the pools the blocks of every span they hold whole, and gives those spans back once
//! their entries are durably zero. A block that is not on a free list (live, retired, in a
//! busy thread's cache, pending, in the delete reserve) keeps its span, so the sweep never
//! takes a span out from under a block someone holds. It costs a pass over the free lists,
//! so it runs only when blocks were freed since the last sweep that found nothing.
//!
//! # The delete reserve
//!
//! A delete writes an anti-block, so in a heap with no free space a delete would need space
//! to give space back. The allocator keeps [`RESERVE_BLOCKS`] free blocks of the smallest
//! class that only anti-blocks may take, once every other source has failed (an anti-block
//! then also takes a free block of any other class). The reserve is filled when the heap is
//! created or opened, carving a span for it if the free blocks of the smallest class do not
//! suffice, and refilled first whenever reclamation returns blocks of that class. A burst of
//! deletes larger than the reserve waits for reclamation (see `Heap::run_op`).

pub(crate) mod block;
pub(crate) mod size_class;

use std::collections::BTreeSet;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::base::epoch::Epoch;
use crate::base::layout::{
    Geometry, HEADER_LEN, META_RETIRED, RawHeader, SPAN_COUNT_OFFSET, SPAN_SIZE, SpanEntry,
    TRAILER_LEN, block_capacity, payload_checksum, payload_checksum_words, span_count_word,
};
use crate::error::{Error, Result};
use crate::persist::Media;
use block::{BlockInfo, BlockSpec, PBlock};
use size_class::{NUM_CLASSES, blocks_per_span, class_for, class_size, is_block_start, spans_for};

/// How many blocks a thread cache takes from (or gives back to) a class pool at once.
const REFILL: usize = 64;
/// How many freed blocks a thread cache collects before it makes their invalidation durable.
const PENDING_LIMIT: usize = 64;
/// How many blocks of the smallest class the delete reserve holds (16 KiB).
pub(crate) const RESERVE_BLOCKS: usize = 256;
/// Heaps with fewer data spans than this have no delete reserve: it would take a whole span
/// from a heap that has hardly any.
const RESERVE_MIN_SPANS: u64 = 4;
/// The size class anti-blocks (a header and no payload) are allocated from.
const ANTI_CLASS: u8 = 0;

/// What the DRAM mirror of the span table says about a span.
const MIRROR_FREE: u32 = 0;
const MIRROR_LARGE_HEAD: u32 = 1 << 31;
const MIRROR_LARGE_CONT: u32 = 1 << 30;
/// A span that holds its group's span table (never free, never a block).
pub(crate) const MIRROR_TABLE: u32 = MIRROR_LARGE_CONT | 1;

fn mirror_class(class: u8) -> u32 {
    u32::from(class) + 1
}

/// Where a block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Small { class: u8 },
    Large { span: u64, extent: u64 },
}

impl Place {
    fn capacity(self) -> u64 {
        match self {
            Place::Small { class } => block_capacity(class_size(class)),
            Place::Large { extent, .. } => block_capacity(extent * SPAN_SIZE),
        }
    }
}

/// A freed block whose header invalidation is not yet known to be durable.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    offset: u64,
    place: Place,
}

/// A thread's cache of free blocks: per class, blocks whose header is durably invalid, and
/// blocks freed through the raw interface whose invalidation is not yet known to be durable.
/// The epoch layer keeps one per thread slot and hands it to the allocator through
/// [`Caches`].
#[derive(Debug)]
pub(crate) struct ThreadCache {
    free: Vec<Vec<u64>>,
    pending: Vec<Pending>,
}

impl Default for ThreadCache {
    fn default() -> Self {
        ThreadCache {
            free: vec![Vec::new(); NUM_CLASSES],
            pending: Vec::new(),
        }
    }
}

/// Where an allocation finds the calling thread's cache and, when the heap is full, the
/// caches no thread is using at the moment (the epoch layer's thread slots).
pub(crate) trait Caches {
    /// Runs `f` on the calling thread's cache.
    fn mine<R>(&self, f: impl FnOnce(&mut ThreadCache) -> R) -> R;

    /// Runs `f` on every cache no thread is using now, until it returns `Some`; caches in
    /// use are skipped.
    fn find_idle<R>(&self, f: impl FnMut(&mut ThreadCache) -> Option<R>) -> Option<R>;
}

/// What recovery found free, to seed a new allocator.
#[derive(Debug, Default)]
pub(crate) struct FreeState {
    /// The DRAM mirror of the span table, one entry per span.
    pub(crate) mirror: Vec<u32>,
    /// Spans whose table entry is durably zero.
    pub(crate) free_spans: Vec<u64>,
    /// Per class, blocks whose header is durably invalid.
    pub(crate) free_blocks: Vec<Vec<u64>>,
}

impl FreeState {
    pub(crate) fn new(span_count: u64) -> FreeState {
        FreeState {
            mirror: vec![MIRROR_FREE; span_count as usize],
            free_spans: Vec::new(),
            free_blocks: vec![Vec::new(); NUM_CLASSES],
        }
    }

    pub(crate) fn mark_class(&mut self, span: u64, class: u8) {
        if let Some(slot) = self.mirror.get_mut(span as usize) {
            *slot = mirror_class(class);
        }
    }

    pub(crate) fn mark_large(&mut self, span: u64, extent: u64) {
        mark_large(&mut self.mirror, span, extent);
    }

    pub(crate) fn mark_table(&mut self, span: u64) {
        if let Some(slot) = self.mirror.get_mut(span as usize) {
            *slot = MIRROR_TABLE;
        }
    }
}

/// The mirror entry of the `index`-th span of a large block covering `extent` spans.
fn large_mirror(index: u64, extent: u64) -> u32 {
    if index == 0 {
        MIRROR_LARGE_HEAD | extent as u32
    } else {
        MIRROR_LARGE_CONT
    }
}

fn mark_large(mirror: &mut [u32], span: u64, extent: u64) {
    let spans = mirror.iter_mut().skip(span as usize).take(extent as usize);
    for (i, slot) in (0..).zip(spans) {
        *slot = large_mirror(i, extent);
    }
}

/// Allocation statistics, for monitoring and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocStats {
    /// Spans of blocks in the heap now.
    pub spans: u64,
    /// The most spans of blocks the heap may grow to (see `HeapConfig::max_size`); `spans`
    /// when it does not grow.
    pub spans_limit: u64,
    /// How many times the heap grew since it was opened.
    pub growths: u64,
    /// Spans not carved into blocks and not part of a large block.
    pub free_spans: u64,
    /// Blocks held in the delete reserve (see `docs/design.md`, "The delete reserve").
    pub reserve_blocks: u64,
    /// Spans the reserve's blocks lie in.
    pub reserve_spans: u64,
    /// Size-class spans given back to the free spans while the heap ran, because every block
    /// in them was free (see `docs/design.md`, "Free").
    pub spans_released: u64,
}

/// The allocator of one heap. See the module docs for its invariants.
pub(crate) struct Allocator {
    /// The heap's layout; its `span_count` is the count at open (see `spans`).
    geometry: Geometry,
    /// The spans the heap has now (it grows; see the module docs).
    spans: AtomicU64,
    /// The most spans it may have.
    limit: u64,
    /// Held while the heap grows.
    growth: Mutex<u64>,
    /// One entry per span the heap may have, zero (free) past the spans it has.
    mirror: Box<[AtomicU32]>,
    span_pool: Mutex<BTreeSet<u64>>,
    class_pools: Box<[Mutex<Vec<u64>>]>,
    /// The delete reserve (see the module docs): free blocks of [`ANTI_CLASS`] with durably
    /// invalid headers, for anti-blocks only.
    reserve: Mutex<Vec<u64>>,
    /// Counts the times blocks became free (reached a free list) since the heap opened.
    freed: AtomicU64,
    /// The value of `freed` when a sweep last found no span to release ([`u64::MAX`]: never).
    fruitless: AtomicU64,
    /// Spans the sweeps gave back.
    spans_released: AtomicU64,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The free lists can hold millions of entries: summarise.
        f.debug_struct("Allocator")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The allocator's locks guard plain lists that are never left half-updated across a
    // panic point, so a poisoned lock still holds consistent data.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Allocator {
    /// An allocator for a heap of `geometry` that may grow to `limit` spans, seeded with what
    /// recovery (or creation) found free.
    pub(crate) fn new(geometry: Geometry, limit: u64, free: FreeState) -> Result<Allocator> {
        let limit = limit.max(geometry.span_count);
        let slots = usize::try_from(limit).map_err(|_| Error::BadSize {
            size: geometry.len_with(limit).unwrap_or(u64::MAX),
            why: "larger than the address space",
        })?;
        // Zeroed memory from the allocator: the pages past the spans the heap has are never
        // touched until it grows into them.
        let mirror = <[AtomicU32] as zerocopy::FromZeros>::new_box_zeroed_with_elems(slots)
            .map_err(|_| Error::BadSize {
                size: geometry.len_with(limit).unwrap_or(u64::MAX),
                why: "its span map does not fit in memory",
            })?;
        for (slot, value) in mirror.iter().zip(free.mirror) {
            // ORDERING: not shared yet.
            slot.store(value, Ordering::Relaxed);
        }
        let class_pools = free.free_blocks.into_iter().map(Mutex::new).collect();
        Ok(Allocator {
            geometry,
            spans: AtomicU64::new(geometry.span_count),
            limit,
            growth: Mutex::new(0),
            mirror,
            span_pool: Mutex::new(free.free_spans.into_iter().collect()),
            class_pools,
            reserve: Mutex::new(Vec::new()),
            freed: AtomicU64::new(0),
            fruitless: AtomicU64::new(u64::MAX),
            spans_released: AtomicU64::new(0),
        })
    }

    /// The heap's layout with the spans it has now.
    pub(crate) fn geometry(&self) -> Geometry {
        Geometry {
            // ORDERING: grows only, under `growth`; a stale count names fewer spans.
            span_count: self.spans.load(Ordering::Acquire),
            ..self.geometry
        }
    }

    /// The span `offset` lies in, if it lies past the data offset (whether the heap has that
    /// span is the mirror's to say: past the spans it has, every entry is free).
    #[inline]
    fn span_index(&self, offset: u64) -> Option<u64> {
        Some(offset.checked_sub(self.geometry.data_offset)? / SPAN_SIZE)
    }

    /// Fills the delete reserve from the free blocks of [`ANTI_CLASS`], carving a span for
    /// it if they do not suffice and a span is free. A heap too small for a reserve, or
    /// opened full, runs without one (or with what could be found).
    pub(crate) fn fill_reserve(&self, media: &Media) -> Result<()> {
        if !self.has_reserve() {
            return Ok(());
        }
        let mut reserve = lock(&self.reserve);
        let wanted = RESERVE_BLOCKS.saturating_sub(reserve.len());
        reserve.extend(take_last(
            &mut lock(&self.class_pools[usize::from(ANTI_CLASS)]),
            wanted,
        ));
        let wanted = RESERVE_BLOCKS.saturating_sub(reserve.len());
        if wanted == 0 {
            return Ok(());
        }
        match self.carve(media, ANTI_CLASS, 0) {
            Ok(mut blocks) => {
                // The reserve takes the span's last blocks; the pool, a stack, gets the rest
                // so that they are handed out in address order, as a carving's are.
                let reserved = blocks.split_off(blocks.len().saturating_sub(wanted));
                reserve.extend(reserved);
                lock(&self.class_pools[usize::from(ANTI_CLASS)]).extend(blocks.into_iter().rev());
                Ok(())
            }
            Err(Error::OutOfSpace { .. }) => Ok(()),
            Err(other) => Err(other),
        }
    }

    /// Whether this heap is big enough for a delete reserve.
    fn has_reserve(&self) -> bool {
        // ORDERING: grows only; a heap that has just grown big enough may miss one refill.
        self.spans.load(Ordering::Relaxed) >= RESERVE_MIN_SPANS
    }

    /// An anti-block's last resort: a block from the delete reserve, else a free block of
    /// any size class (an anti-block fits in every one).
    fn alloc_anti_fallback(&self) -> Option<u64> {
        if let Some(offset) = lock(&self.reserve).pop() {
            return Some(offset);
        }
        self.class_pools.iter().find_map(|pool| lock(pool).pop())
    }

    /// The error of an allocation of `requested` payload bytes that found no space, with
    /// what is free.
    fn out_of_space(&self, caches: &impl Caches, requested: u64) -> Error {
        let free_spans = lock(&self.span_pool).len() as u64;
        let mut free_bytes = 0;
        let total = requested.saturating_add(HEADER_LEN + TRAILER_LEN);
        let wanted = class_for(total);
        let mut count = |class: usize, blocks: usize| {
            let class = u8::try_from(class).unwrap_or(u8::MAX);
            if Some(class) != wanted {
                free_bytes += blocks as u64 * class_size(class);
            }
        };
        for (class, pool) in self.class_pools.iter().enumerate() {
            count(class, lock(pool).len());
        }
        caches.find_idle(|cache| {
            for (class, blocks) in cache.free.iter().enumerate() {
                count(class, blocks.len());
            }
            None::<()>
        });
        Error::OutOfSpace {
            requested,
            free_spans,
            free_bytes,
        }
    }

    fn mirror(&self, span: u64) -> u32 {
        // ORDERING: the mirror entry of a span is written before any block of the span is
        // handed out, and handing out goes through a mutex, which orders it.
        self.mirror
            .get(span as usize)
            .map_or(MIRROR_FREE, |m| m.load(Ordering::Relaxed))
    }

    fn set_mirror(&self, span: u64, value: u32) {
        if let Some(m) = self.mirror.get(span as usize) {
            // ORDERING: see `mirror`.
            m.store(value, Ordering::Relaxed);
        }
    }

    /// Where the block at `offset` lives, if `offset` is a block start of a carved span.
    #[inline]
    fn locate(&self, offset: u64) -> Result<Place> {
        let invalid = || Error::InvalidBlock { offset };
        let span = self
            .span_index(offset)
            .ok_or_else(|| Error::InvalidBlock { offset })?;
        let within = offset - self.geometry.span_start(span);
        let state = self.mirror(span);
        if state & MIRROR_LARGE_HEAD != 0 {
            return if within == 0 {
                Ok(Place::Large {
                    span,
                    extent: u64::from(state & !MIRROR_LARGE_HEAD),
                })
            } else {
                Err(invalid())
            };
        }
        if state == MIRROR_FREE || state & MIRROR_LARGE_CONT != 0 {
            return Err(invalid());
        }
        let class = (state - 1) as u8;
        if !is_block_start(class, within) {
            return Err(invalid());
        }
        Ok(Place::Small { class })
    }

    /// The payload capacity of `block`.
    pub(crate) fn capacity(&self, block: PBlock) -> Result<u64> {
        Ok(self.locate(block.0)?.capacity())
    }

    /// The heap's creation id, mixed into every checksum.
    pub(crate) fn creation_id(&self) -> u64 {
        self.geometry.creation_id
    }

    /// Reads and validates `block`'s header.
    pub(crate) fn header(&self, media: &Media, block: PBlock) -> Result<BlockInfo> {
        self.checked_header(media, block, false)
            .map(|(info, _)| info)
    }

    /// [`header`](Self::header) for a caller about to read the payload: the block's lines
    /// (as many as its size class holds) are requested before the header is read, so that
    /// the payload's cache misses overlap the header's instead of following it. Also returns
    /// the meta word the header was read with (for [`mark_retired_seen`](Self::mark_retired_seen)).
    pub(crate) fn header_for_read(&self, media: &Media, block: PBlock) -> Result<(BlockInfo, u64)> {
        self.checked_header(media, block, true)
    }

    // Always inlined, like `read_header`, whose reasons it shares.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn checked_header(
        &self,
        media: &Media,
        block: PBlock,
        prefetch: bool,
    ) -> Result<(BlockInfo, u64)> {
        let capacity = self.locate(block.0)?.capacity();
        if prefetch {
            media.prefetch_for_read(block.0, HEADER_LEN + capacity);
        }
        read_header_and_meta(media, self.geometry.creation_id, block.0, capacity)?
            .ok_or_else(|| Error::InvalidBlock { offset: block.0 })
    }

    /// Allocates a block for `len` payload bytes and writes its header. The header and
    /// payload are not flushed: the caller decides when they must be durable.
    ///
    /// An anti-block ([`BlockKind::Delete`](block::BlockKind::Delete)) that finds no space
    /// takes a block from the delete reserve.
    pub(crate) fn alloc(
        &self,
        media: &Media,
        caches: &impl Caches,
        spec: BlockSpec,
        len: u64,
    ) -> Result<PBlock> {
        let (offset, stored_len) = self.place(media, caches, spec, len)?;
        self.write_header(media, offset, &spec.raw(stored_len))?;
        Ok(PBlock(offset))
    }

    /// Allocates a block holding `payload` and writes all of it, its meta word last (as
    /// [`fill_cached`](Self::fill_cached) does, from wherever [`alloc`](Self::alloc) finds
    /// the block): the header becomes valid only over the whole payload, which readers
    /// outside operations rely on (INV-READ-1).
    pub(crate) fn alloc_whole(
        &self,
        media: &Media,
        caches: &impl Caches,
        spec: BlockSpec,
        payload: &[u8],
    ) -> Result<PBlock> {
        let (offset, stored_len) = self.place(media, caches, spec, payload.len() as u64)?;
        self.write_block(media, offset, spec, stored_len, payload)?;
        Ok(PBlock(offset))
    }

    /// A free block for `len` payload bytes, handed out (see [`hand_out`]), with the length
    /// its header stores.
    fn place(
        &self,
        media: &Media,
        caches: &impl Caches,
        spec: BlockSpec,
        len: u64,
    ) -> Result<(u64, u32)> {
        let stored_len = u32::try_from(len).map_err(|_| self.out_of_space(caches, len))?;
        let total = len
            .checked_add(HEADER_LEN + TRAILER_LEN)
            .ok_or_else(|| self.out_of_space(caches, len))?;
        let found = match class_for(total) {
            Some(class) => self.alloc_small(media, caches, class, len),
            None => self.alloc_large(media, caches, spans_for(total), len),
        };
        let offset = match found {
            Ok(offset) => offset,
            Err(Error::OutOfSpace { .. }) => {
                let anti = spec.kind == block::BlockKind::Delete && len == 0;
                match anti.then(|| self.alloc_anti_fallback()).flatten() {
                    Some(offset) => offset,
                    None => return Err(self.out_of_space(caches, len)),
                }
            }
            Err(other) => return Err(other),
        };
        Ok((hand_out(offset), stored_len))
    }

    /// Writes a whole block at `offset`: the header of `spec` for `len` payload bytes, the
    /// payload and its trailer, and the meta word last.
    #[inline]
    fn write_block(
        &self,
        media: &Media,
        offset: u64,
        spec: BlockSpec,
        len: u32,
        payload: &[u8],
    ) -> Result<()> {
        let header = spec.raw(len);
        let creation_id = self.geometry.creation_id;
        media.write_block(
            offset,
            &header.body_words(),
            header.meta(offset, creation_id),
            payload,
            &payload_checksum_words(offset, creation_id),
        )
    }

    /// Allocates a block holding `payload` from `cache`, the caller's thread cache, and
    /// writes all of it at once: the header, the payload and its checksum in the trailer (as
    /// [`alloc`](Self::alloc) and then [`write_payload`](Self::write_payload) would, with one
    /// check of the backend and of the bounds). `None`, with nothing done, when the cache
    /// holds no block for it (or the payload needs a large block): the caller takes the long
    /// way then. The caller holds the cache already, so that an operation takes its slot's
    /// cache and its log of the epoch in one step.
    #[inline]
    pub(crate) fn fill_cached(
        &self,
        media: &Media,
        cache: &mut ThreadCache,
        spec: BlockSpec,
        payload: &[u8],
    ) -> Result<Option<PBlock>> {
        let len = payload.len() as u64;
        let Some(class) = len
            .checked_add(HEADER_LEN + TRAILER_LEN)
            .and_then(class_for)
        else {
            return Ok(None);
        };
        let Some(offset) = Self::pop_cached(media, cache, class) else {
            return Ok(None);
        };
        // A small class holds far less than 4 GiB.
        self.write_block(media, hand_out(offset), spec, len as u32, payload)?;
        Ok(Some(PBlock(offset)))
    }

    /// A small block for `len` payload bytes from the caller's cache, without its header:
    /// for a write that fills the payload while it waits for something else, and writes the
    /// header (with [`write_header`](Self::write_header)) once it knows it. `None` when
    /// `len` needs a large block, or when there is no small block to take (the caller falls
    /// back to [`alloc`](Self::alloc), which reports why). Its meta word is still the durable
    /// zero it had on the free list, so until the header is written it is as free as it was;
    /// [`put_back`](Self::put_back) returns it unused.
    #[inline]
    pub(crate) fn take_small(
        &self,
        media: &Media,
        caches: &impl Caches,
        len: u64,
    ) -> Option<PBlock> {
        let class = class_for(len.checked_add(HEADER_LEN + TRAILER_LEN)?)?;
        self.alloc_small(media, caches, class, len)
            .ok()
            .map(|offset| PBlock(hand_out(offset)))
    }

    /// Puts a small block whose meta word is zero and that nothing else can reach on the
    /// caller's free list, so that the caller's next allocation of its class reuses it: a
    /// block from [`take_small`](Self::take_small) whose header was never written, or one an
    /// operation wrote and killed in the same epoch (INV-ALLOC-1's exception). `false`,
    /// doing nothing, for a large block, which the caller hands to reclamation instead.
    pub(crate) fn put_back(&self, caches: &impl Caches, block: PBlock) -> bool {
        match self.locate(block.0) {
            Ok(Place::Small { class }) => {
                caches.mine(|cache| cache.free[usize::from(class)].push(block.0));
                true
            }
            _ => false,
        }
    }

    /// Writes `block`'s payload checksum into its trailer, right after the payload
    /// (INV-SUM-1), and returns the range to write back (header, payload and trailer); `None`
    /// if the block holds no valid header any more (it was killed), or, with `epoch`, a
    /// header of another epoch (it was killed and handed out again: its new owner writes
    /// its own trailer, and may be writing the payload now). `buf` is scratch space.
    pub(crate) fn seal_payload(
        &self,
        media: &Media,
        block: PBlock,
        epoch: Option<Epoch>,
        buf: &mut Vec<u8>,
    ) -> Result<Option<(u64, u64)>> {
        let Ok(place) = self.locate(block.0) else {
            return Ok(None);
        };
        let creation_id = self.geometry.creation_id;
        let Some(info) = read_header(media, creation_id, block.0, place.capacity())? else {
            return Ok(None);
        };
        if epoch.is_some_and(|epoch| info.spec.epoch != epoch) {
            return Ok(None);
        }
        let len = u64::from(info.len);
        buf.resize(info.len as usize, 0);
        media.read(block.payload_offset(), buf)?;
        self.write_trailer(media, block, buf)?;
        Ok(Some((block.0, HEADER_LEN + len + TRAILER_LEN)))
    }

    /// Writes `payload` into `block` and its checksum into the trailer right after it
    /// (INV-SUM-1), with one check of the range for both.
    #[inline]
    pub(crate) fn write_payload(&self, media: &Media, block: PBlock, payload: &[u8]) -> Result<()> {
        media.write_payload(
            block.payload_offset(),
            payload,
            &payload_checksum_words(block.0, self.geometry.creation_id),
        )
    }

    /// Writes the checksum of `payload`, which `block` holds, into the block's trailer.
    pub(crate) fn write_trailer(&self, media: &Media, block: PBlock, payload: &[u8]) -> Result<()> {
        media.write(
            block.payload_offset() + payload.len() as u64,
            &self.trailer(block, payload),
        )
    }

    /// The trailer of `block` holding `payload`: the payload's checksum, little-endian.
    #[inline]
    fn trailer(&self, block: PBlock, payload: &[u8]) -> [u8; 4] {
        payload_checksum(block.0, self.geometry.creation_id, payload).to_le_bytes()
    }

    /// Writes a whole header: the four body words, then the meta word, which with its
    /// checksum makes the header valid (INV-HDR-1).
    #[inline]
    pub(crate) fn write_header(
        &self,
        media: &Media,
        offset: u64,
        header: &RawHeader,
    ) -> Result<()> {
        media.store_header(
            offset,
            &header.body_words(),
            header.meta(offset, self.geometry.creation_id),
        )
    }

    /// Sets the retired bit of a live block's meta word. Fails with `InvalidBlock` if the
    /// block is not live, and with `Retired` if it is retired already (INV-EP-3).
    pub(crate) fn mark_retired(&self, media: &Media, block: PBlock) -> Result<()> {
        let offset = block.0;
        self.locate(offset)?;
        let meta = media.load(offset)?;
        if meta == 0 {
            return Err(Error::InvalidBlock { offset });
        }
        if meta & META_RETIRED != 0 {
            return Err(Error::Retired { offset });
        }
        match media.compare_exchange(offset, meta, meta | META_RETIRED)? {
            Ok(_) => Ok(()),
            Err(_) => Err(Error::Retired { offset }),
        }
    }

    /// [`mark_retired`](Self::mark_retired) for a block whose header was read with the meta
    /// word `seen`, without reading it again: `Ok(false)`, changing nothing, if the word is
    /// no longer `seen` (the header changed, or the block was retired, since) or `seen` was
    /// retired already. (No bounds check of its own: the header read that gave `seen`
    /// located the block, and the media checks its range.)
    pub(crate) fn mark_retired_seen(media: &Media, block: PBlock, seen: u64) -> Result<bool> {
        if seen == 0 || seen & META_RETIRED != 0 {
            return Ok(false);
        }
        Ok(media
            .compare_exchange(block.0, seen, seen | META_RETIRED)?
            .is_ok())
    }

    /// Clears the retired bit set by [`mark_retired`](Self::mark_retired) (an aborted
    /// operation gives its claim back). A compare-and-swap, not a store: a nonblocking
    /// structure's reader may have claimed a block that its owner's rollback kills at the
    /// same time (its meta word stored 0), and a store would bring the header back.
    pub(crate) fn clear_retired(&self, media: &Media, block: PBlock) -> Result<()> {
        self.locate(block.0)?;
        let meta = media.load(block.0)?;
        if meta & META_RETIRED != 0 {
            // Failing means the word changed since the load: killed, which is final.
            let _ = media.compare_exchange(block.0, meta, meta & !META_RETIRED)?;
        }
        Ok(())
    }

    /// Invalidates blocks whose reclamation the epoch protocol allows, makes that durable,
    /// and gives them to the shared pools (not to the calling thread's cache: the caller is
    /// usually the epoch advancer, which does not allocate).
    pub(crate) fn release(&self, media: &Media, blocks: &[PBlock]) -> Result<()> {
        let mut pending = Vec::with_capacity(blocks.len());
        self.invalidate(media, blocks, &mut pending)?;
        // PERSIST: INV-ALLOC-1: the invalidations are durable before the blocks are reused.
        media.fence()?;
        self.reuse(&mut pending);
        Ok(())
    }

    /// Zeroes the meta words of `blocks` (and the span entries of large ones) and flushes
    /// them, without a fence, and appends them to `pending`: they go back to the free lists
    /// through [`reuse`](Self::reuse) once that is durable (INV-ALLOC-1). The caller keeps
    /// `pending` for its capacity (an advance invalidates millions of blocks a second under
    /// a heavy load; a vector that new each time costs the advancer a page fault every
    /// 4 KiB of it). On an error nothing is appended.
    pub(crate) fn invalidate(
        &self,
        media: &Media,
        blocks: &[PBlock],
        pending: &mut Vec<Pending>,
    ) -> Result<()> {
        let start = pending.len();
        pending.reserve(blocks.len());
        let mut append = || {
            for block in blocks {
                let place = self.locate(block.0)?;
                media.store(block.0, 0)?;
                if let Place::Large { span, .. } = place {
                    media.store(self.geometry.span_entry_offset(span), 0)?;
                }
                pending.push(Pending {
                    offset: block.0,
                    place,
                });
            }
            // PERSIST: INV-ALLOC-1: the caller's fence (or commit) makes these durable.
            self.flush_invalidated(media, &pending[start..])
        };
        let result = append();
        if result.is_err() {
            pending.truncate(start);
        }
        result
    }

    /// Hands blocks whose invalidation is durable back to the free lists, leaving `pending`
    /// empty (its capacity stays the caller's). Blocks of [`ANTI_CLASS`] fill the delete
    /// reserve first, from the last of them. Each class's blocks go to its pool in the order
    /// `pending` holds them, one pass over `pending` for each class it holds.
    pub(crate) fn reuse(&self, pending: &mut Vec<Pending>) {
        let mut counts = [0usize; NUM_CLASSES];
        for p in pending.iter() {
            match p.place {
                Place::Small { class } => counts[usize::from(class)] += 1,
                Place::Large { span, extent } => self.return_spans(span, extent),
            }
        }
        let of_class = |class: usize| {
            pending.iter().filter_map(move |p| match p.place {
                Place::Small { class: c } if usize::from(c) == class => Some(p.offset),
                _ => None,
            })
        };
        let anti = usize::from(ANTI_CLASS);
        if counts[anti] > 0 && self.has_reserve() {
            let mut reserve = lock(&self.reserve);
            let wanted = RESERVE_BLOCKS
                .saturating_sub(reserve.len())
                .min(counts[anti]);
            reserve.extend(of_class(anti).skip(counts[anti] - wanted));
            counts[anti] -= wanted;
        }
        self.note_freed();
        for (class, &count) in counts.iter().enumerate() {
            if count > 0 {
                lock(&self.class_pools[class]).extend(of_class(class).take(count));
            }
        }
        pending.clear();
    }

    fn alloc_small(&self, media: &Media, caches: &impl Caches, class: u8, len: u64) -> Result<u64> {
        match caches.mine(|cache| self.alloc_cached(media, cache, class, len))? {
            Some(offset) => Ok(offset),
            None => self.steal(media, caches, class, len),
        }
    }

    /// A block of `class` from `cache`, refilled from the class pool or a new carving when
    /// empty; `None` when the heap has no free span left to carve.
    fn alloc_cached(
        &self,
        media: &Media,
        cache: &mut ThreadCache,
        class: u8,
        len: u64,
    ) -> Result<Option<u64>> {
        let c = usize::from(class);
        if let Some(offset) = Self::pop_cached(media, cache, class) {
            return Ok(Some(offset));
        }
        if !cache.pending.is_empty() {
            self.drain(media, cache)?;
            if let Some(offset) = cache.free[c].pop() {
                return Ok(Some(offset));
            }
        }
        cache.free[c].extend(take_last(&mut lock(&self.class_pools[c]), REFILL));
        if let Some(offset) = cache.free[c].pop() {
            return Ok(Some(offset));
        }
        match self.carve(media, class, len) {
            Ok(blocks) => {
                cache.free[c].extend(blocks.into_iter().rev());
                Ok(cache.free[c].pop())
            }
            Err(Error::OutOfSpace { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// A block of `class` that `cache` holds, if any.
    #[inline]
    fn pop_cached(media: &Media, cache: &mut ThreadCache, class: u8) -> Option<u64> {
        let free = &mut cache.free[usize::from(class)];
        let offset = free.pop()?;
        // The next block of this class was freed epochs ago and is long out of the cache:
        // ask for its lines now, so the next allocation's stores find them.
        if let Some(&next) = free.last() {
            media.prefetch_for_write(next, class_size(class));
        }
        Some(offset)
    }

    /// Drains the pending frees of every cache not in use right now, so that blocks and
    /// spans freed by other threads become reusable.
    fn drain_everywhere(&self, media: &Media, caches: &impl Caches) -> Result<()> {
        // A cache in use is drained by its own thread.
        let failed = caches.find_idle(|cache| {
            if cache.pending.is_empty() {
                return None;
            }
            self.drain(media, cache).err()
        });
        failed.map_or(Ok(()), Err)
    }

    /// The heap has no free span: take a free block of `class` from a cache no thread is
    /// using, or carve a span that draining other caches' frees gave back, before reporting
    /// the heap full. Called without the caller's cache in hand.
    fn steal(&self, media: &Media, caches: &impl Caches, class: u8, len: u64) -> Result<u64> {
        let c = usize::from(class);
        self.drain_everywhere(media, caches)?;
        if let Some(offset) = caches.find_idle(|cache| cache.free[c].pop()) {
            return Ok(offset);
        }
        // Draining may have given spans back; if not, release the spans whose blocks are all
        // free, else grow the heap, and take from what that gave (another thread may take it
        // first: try again).
        loop {
            if let Some(offset) =
                caches.mine(|cache| self.alloc_cached(media, cache, class, len))?
            {
                return Ok(offset);
            }
            if !self.make_room(media, caches, 1)? {
                return Err(full(len));
            }
        }
    }

    /// Takes `extent` free spans in a row as [`take_free_spans`](Self::take_free_spans)
    /// does, and tells the media they are in use.
    fn take_spans(&self, media: &Media, extent: u64, len: u64) -> Result<u64> {
        let first = self.take_free_spans(extent, len)?;
        media
            .region()
            .in_use(self.geometry.span_start(first.saturating_add(extent)));
        Ok(first)
    }

    /// Tells the media how far into the heap blocks have been handed out (see
    /// [`Region::in_use`](crate::base::region::Region::in_use)): up to the end of the last
    /// span that is not free. From then on [`take_spans`](Self::take_spans) tells it as the
    /// mark moves.
    pub(crate) fn report_in_use(&self, media: &Media) {
        // ORDERING: see `geometry`.
        let spans = self.spans.load(Ordering::Acquire);
        let last = (0..spans).rev().find(|&span| {
            // ORDERING: a hint for the mapping; nothing is read through it.
            usize::try_from(span)
                .ok()
                .and_then(|i| self.mirror.get(i))
                .is_some_and(|entry| entry.load(Ordering::Relaxed) != MIRROR_FREE)
        });
        let end = last.map_or(self.geometry.data_offset, |span| {
            self.geometry.span_start(span + 1)
        });
        media.region().in_use(end);
    }

    /// Takes `extent` free spans in a row (the lowest, for one), or fails with what
    /// [`full`] says of a payload of `len` bytes.
    fn take_free_spans(&self, extent: u64, len: u64) -> Result<u64> {
        let mut pool = lock(&self.span_pool);
        let first = if extent == 1 {
            pool.pop_first()
        } else {
            let mut run_start = None;
            let mut run_len = 0;
            let mut prev = None;
            let mut found = None;
            for &span in pool.iter() {
                if prev.is_some_and(|p: u64| p + 1 == span) {
                    run_len += 1;
                } else {
                    run_start = Some(span);
                    run_len = 1;
                }
                prev = Some(span);
                if run_len == extent {
                    found = run_start;
                    break;
                }
            }
            if let Some(first) = found {
                for span in first..first + extent {
                    pool.remove(&span);
                }
            }
            found
        };
        first.ok_or_else(|| full(len))
    }

    fn return_spans(&self, first: u64, extent: u64) {
        let mut pool = lock(&self.span_pool);
        for span in first..first + extent {
            self.set_mirror(span, MIRROR_FREE);
            pool.insert(span);
        }
    }

    /// Zeroes the words at `offsets` that are not zero yet and makes that durable before it
    /// returns: a new carving's block starts (INV-SPAN-1), released spans' entries
    /// (INV-SPAN-2), new group tables and, at open, the entries a growth that was not durable
    /// left past the end of a journal heap (INV-GROW-1).
    pub(crate) fn clear_words(media: &Media, offsets: impl Iterator<Item = u64>) -> Result<()> {
        let mut dirty = false;
        for offset in offsets {
            dirty |= clear_meta(media, offset)?;
        }
        if dirty {
            // PERSIST: completes the flushes above before what depends on them is written.
            media.fence()?;
        }
        Ok(())
    }

    /// Takes a free span, carves it into blocks of `class`, and returns their offsets. `len`
    /// is the payload size being allocated, reported if the heap is full.
    fn carve(&self, media: &Media, class: u8, len: u64) -> Result<Vec<u64>> {
        let span = self.take_spans(media, 1, len)?;
        let start = self.geometry.span_start(span);
        let size = class_size(class);
        let blocks: Vec<u64> = (0..blocks_per_span(class))
            .map(|i| start + i * size)
            .collect();
        let result = Self::clear_words(media, blocks.iter().copied()).and_then(|()| {
            let entry = self.geometry.span_entry_offset(span);
            media.store(
                entry,
                SpanEntry::Class(class).encode(span, self.geometry.creation_id),
            )?;
            // PERSIST: the span's class is durable before any of its blocks is handed out
            // (INV-SPAN-2), so recovery can parse every block it may hold. On the journal,
            // in order before the blocks' own records (see `Media::persist_ordered`).
            media.persist_ordered(entry, 8)
        });
        if let Err(err) = result {
            self.return_spans(span, 1);
            return Err(err);
        }
        self.set_mirror(span, mirror_class(class));
        Ok(blocks)
    }

    fn alloc_large(
        &self,
        media: &Media,
        caches: &impl Caches,
        extent: u64,
        len: u64,
    ) -> Result<u64> {
        if extent > u64::from(u32::MAX >> 2) {
            return Err(full(len));
        }
        // Freed large blocks may still sit on pending lists: drain them; then release the
        // spans whose blocks are all free; then grow the heap; retrying after each.
        let mut drained = false;
        let span = loop {
            match self.take_spans(media, extent, len) {
                Ok(span) => break span,
                Err(Error::OutOfSpace { .. }) => {}
                Err(other) => return Err(other),
            }
            if !drained {
                drained = true;
                self.drain_everywhere(media, caches)?;
            } else if !self.make_room(media, caches, extent)? {
                return Err(full(len));
            }
        };
        let start = self.geometry.span_start(span);
        let result = Self::clear_words(media, std::iter::once(start)).and_then(|()| {
            let entry = self.geometry.span_entry_offset(span);
            let word = SpanEntry::Large(extent as u32).encode(span, self.geometry.creation_id);
            media.store(entry, word)?;
            // PERSIST: the extent is durable before the block is handed out (INV-SPAN-2), or
            // on the journal in order before the block's own records.
            media.persist_ordered(entry, 8)
        });
        if let Err(err) = result {
            self.return_spans(span, extent);
            return Err(err);
        }
        for i in 0..extent {
            self.set_mirror(span + i, large_mirror(i, extent));
        }
        Ok(start)
    }

    /// Frees `block`: invalidates its header at once (so a double free is detected), and
    /// makes the invalidation durable before the block can be reused (INV-ALLOC-1).
    pub(crate) fn free(&self, media: &Media, caches: &impl Caches, block: PBlock) -> Result<()> {
        let offset = block.0;
        let place = self.locate(offset)?;
        let meta = media.load(offset)?;
        if meta == 0 {
            return Err(Error::InvalidBlock { offset });
        }
        if media.compare_exchange(offset, meta, 0)?.is_err() {
            // Another thread freed it first.
            return Err(Error::InvalidBlock { offset });
        }
        if let Place::Large { span, .. } = place {
            media.store(self.geometry.span_entry_offset(span), 0)?;
        }
        caches.mine(|cache| {
            cache.pending.push(Pending { offset, place });
            if cache.pending.len() >= PENDING_LIMIT {
                self.drain(media, cache)?;
            }
            if let Place::Small { class } = place {
                let c = usize::from(class);
                if cache.free[c].len() >= 2 * REFILL {
                    let keep = cache.free[c].len() - REFILL;
                    let spill: Vec<u64> = cache.free[c].drain(keep..).collect();
                    lock(&self.class_pools[c]).extend(spill);
                }
            }
            Ok(())
        })
    }

    /// Makes every pending invalidation in `cache` durable, then makes the blocks reusable.
    fn drain(&self, media: &Media, cache: &mut ThreadCache) -> Result<()> {
        self.make_durable(media, &cache.pending)?;
        for pending in cache.pending.drain(..) {
            match pending.place {
                Place::Small { class } => cache.free[usize::from(class)].push(pending.offset),
                Place::Large { span, extent } => self.return_spans(span, extent),
            }
        }
        self.note_freed();
        Ok(())
    }

    /// When no span is free: releases the spans whose blocks are all free, else grows the
    /// heap for `wanted` contiguous spans; returns whether either made room.
    fn make_room(&self, media: &Media, caches: &impl Caches, wanted: u64) -> Result<bool> {
        Ok(self.release_free_spans(media, caches)? > 0 || self.grow(media, wanted)?)
    }

    /// Grows the heap to make room for `wanted` more contiguous spans (see `docs/design.md`,
    /// "Grow"); returns whether it grew: not at the limit, nor when the disk is full.
    fn grow(&self, media: &Media, wanted: u64) -> Result<bool> {
        let mut growths = lock(&self.growth);
        let geometry = self.geometry();
        let Some(target) = geometry.grown_span_count(wanted, self.limit) else {
            return Ok(false);
        };
        let Some(len) = geometry.len_with(target) else {
            return Ok(false);
        };
        match media.extend(len) {
            Ok(()) => {}
            Err(Error::OutOfSpace { .. } | Error::NoDiskSpace { .. }) => return Ok(false),
            Err(other) => return Err(other),
        }
        // The span tables of the new groups are durably zero (all their spans free) before
        // the count names them. The file's new bytes read zero already; this only makes sure.
        let tables = (geometry.span_count..target).filter(|&s| geometry.is_table_span(s));
        Self::clear_words(
            media,
            tables.flat_map(|span| {
                let start = geometry.span_start(span);
                (start..start + SPAN_SIZE).step_by(8)
            }),
        )?;
        media.store(
            SPAN_COUNT_OFFSET,
            span_count_word(target, self.geometry.creation_id),
        )?;
        // PERSIST: INV-GROW-1: the count names the new spans before any of them is carved,
        // so a block in them is durable only once the count is (on the journal, in a record
        // no later than the block's; see `Media::persist_ordered`).
        media.persist_ordered(SPAN_COUNT_OFFSET, 8)?;
        let mut pool = lock(&self.span_pool);
        for span in geometry.span_count..target {
            if geometry.is_table_span(span) {
                self.set_mirror(span, MIRROR_TABLE);
            } else {
                pool.insert(span);
            }
        }
        // ORDERING: read by `geometry`; the spans reach allocations through the pool's lock.
        self.spans.store(target, Ordering::Release);
        drop(pool);
        *growths += 1;
        // A heap created too small for a delete reserve gets one once it is big enough.
        if lock(&self.reserve).is_empty() {
            self.fill_reserve(media)?;
        }
        Ok(true)
    }

    /// Records that blocks became free, so the next sweep looks again.
    fn note_freed(&self) {
        // ORDERING: a hint for the sweep; the free lists themselves are under their locks.
        self.freed.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives every size-class span whose blocks are all on a free list back to the free-span
    /// pool (see the module docs, "Spans given back while the heap runs"); returns how many.
    /// Called by an allocation that found no span to carve, without its cache in hand.
    pub(crate) fn release_free_spans(&self, media: &Media, caches: &impl Caches) -> Result<u64> {
        // ORDERING: hints only (see `note_freed`); a sweep skipped wrongly costs one
        // allocation a failure that the next freeing retries, and never space that was free.
        let freed = self.freed.load(Ordering::Relaxed);
        if self.fruitless.load(Ordering::Relaxed) == freed {
            return Ok(0);
        }
        // Every free block the sweep may count is in a class pool: the caller's and those of
        // caches no thread is using.
        caches.mine(|cache| self.spill(media, cache))?;
        let failed = caches.find_idle(|cache| self.spill(media, cache).err());
        if let Some(err) = failed {
            return Err(err);
        }
        let mut spans = Vec::new();
        for (class, pool) in (0u8..).zip(self.class_pools.iter()) {
            let per_span = blocks_per_span(class);
            let mut pool = lock(pool);
            if (pool.len() as u64) < per_span {
                continue;
            }
            let mut counts: HashMap<u64, u64> = HashMap::new();
            for &offset in pool.iter() {
                if let Some(span) = self.span_index(offset) {
                    *counts.entry(span).or_default() += 1;
                }
            }
            counts.retain(|_, count| *count == per_span);
            if counts.is_empty() {
                continue;
            }
            // Out of the pool under its lock: no allocation can take these blocks any more.
            pool.retain(|&offset| {
                self.span_index(offset)
                    .is_none_or(|span| !counts.contains_key(&span))
            });
            spans.extend(counts.into_keys());
        }
        if spans.is_empty() {
            self.fruitless.store(freed, Ordering::Relaxed);
            return Ok(0);
        }
        spans.sort_unstable();
        // PERSIST: INV-SPAN-2: the entries are durably zero before the spans are carved
        // again. Every block start in them is durably zero already (INV-ALLOC-1: their blocks
        // were all on free lists).
        Self::clear_words(
            media,
            spans
                .iter()
                .map(|&span| self.geometry.span_entry_offset(span)),
        )?;
        for &span in &spans {
            self.return_spans(span, 1);
        }
        let released = spans.len() as u64;
        self.spans_released.fetch_add(released, Ordering::Relaxed);
        Ok(released)
    }

    /// Moves every free block of `cache` (its pending ones once their invalidation is
    /// durable) to the class pools.
    fn spill(&self, media: &Media, cache: &mut ThreadCache) -> Result<()> {
        if !cache.pending.is_empty() {
            self.drain(media, cache)?;
        }
        for (free, pool) in cache.free.iter_mut().zip(self.class_pools.iter()) {
            if !free.is_empty() {
                lock(pool).append(free);
            }
        }
        Ok(())
    }

    /// Flushes the zeroed meta words (and span entries) of `pending` and fences.
    fn make_durable(&self, media: &Media, pending: &[Pending]) -> Result<()> {
        // PERSIST: the flushes are issued by the fencing thread, as fences are per thread.
        self.flush_invalidated(media, pending)?;
        // PERSIST: completes every flush above.
        media.fence()
    }

    /// Flushes the zeroed meta words (and the zeroed span entries of large blocks) of
    /// `pending`: they must be durable before the blocks are reused (INV-ALLOC-1) and the
    /// spans carved again (INV-SPAN-2).
    fn flush_invalidated(&self, media: &Media, pending: &[Pending]) -> Result<()> {
        for pending in pending {
            // PERSIST: INV-ALLOC-1; the caller fences or commits.
            media.flush(pending.offset, 8)?;
            if let Place::Large { span, .. } = pending.place {
                // PERSIST: INV-SPAN-2; the caller fences or commits.
                media.flush(self.geometry.span_entry_offset(span), 8)?;
            }
        }
        Ok(())
    }

    /// Makes `cache`'s pending frees durable (at close).
    pub(crate) fn drain_pending(&self, media: &Media, cache: &mut ThreadCache) -> Result<()> {
        if cache.pending.is_empty() {
            return Ok(());
        }
        self.drain(media, cache)
    }

    pub(crate) fn stats(&self) -> AllocStats {
        let reserve = lock(&self.reserve);
        let spans: BTreeSet<u64> = reserve
            .iter()
            .filter_map(|&offset| self.span_index(offset))
            .collect();
        let geometry = self.geometry();
        AllocStats {
            spans: geometry.data_spans(),
            spans_limit: Geometry {
                span_count: self.limit,
                ..geometry
            }
            .data_spans(),
            growths: *lock(&self.growth),
            free_spans: lock(&self.span_pool).len() as u64,
            reserve_blocks: reserve.len() as u64,
            reserve_spans: spans.len() as u64,
            spans_released: self.spans_released.load(Ordering::Relaxed),
        }
    }
}

/// Takes up to `n` blocks from the end of `blocks` (a free list used as a stack).
fn take_last(blocks: &mut Vec<u64>, n: usize) -> std::vec::Drain<'_, u64> {
    let start = blocks.len().saturating_sub(n);
    blocks.drain(start..)
}

/// The heap has no space for `requested` payload bytes: the bare error the inner allocation
/// paths return, which [`Allocator::alloc`] completes with what is free.
fn full(requested: u64) -> Error {
    Error::OutOfSpace {
        requested,
        free_spans: 0,
        free_bytes: 0,
    }
}

/// Zeroes the meta word of the block start at `offset` if it is not zero yet, and starts
/// writing it back; returns whether it wrote. The caller's fence makes it durable: then no
/// header, valid or torn, is left at `offset` for a later crash to combine with the next
/// one written there (INV-ALLOC-1, INV-SPAN-1, INV-REC-2).
pub(crate) fn clear_meta(media: &Media, offset: u64) -> Result<bool> {
    if media.load(offset)? == 0 {
        return Ok(false);
    }
    media.store(offset, 0)?;
    // PERSIST: the caller fences before anything may depend on the zero.
    media.flush(offset, 8)?;
    Ok(true)
}

/// Whether the payload of the block `info` describes matches the checksum in its trailer.
/// `buf` is scratch space.
pub(crate) fn payload_intact(
    media: &Media,
    creation_id: u64,
    info: &BlockInfo,
    buf: &mut Vec<u8>,
) -> Result<bool> {
    let payload = info.block.payload_offset();
    buf.resize(info.len as usize, 0);
    media.read(payload, buf)?;
    let mut stored = [0u8; 4];
    media.read(payload + u64::from(info.len), &mut stored)?;
    Ok(u32::from_le_bytes(stored) == payload_checksum(info.block.offset(), creation_id, buf))
}

/// Reads the header at `offset` and returns it if valid. Always inlined: the hot paths call
/// it through `checked_header`, and a `BlockInfo` returned through memory was read back in
/// wider pieces than it was written, which the CPU cannot forward from its store buffer.
#[allow(clippy::inline_always)]
#[inline(always)]
pub(crate) fn read_header(
    media: &Media,
    creation_id: u64,
    offset: u64,
    capacity: u64,
) -> Result<Option<BlockInfo>> {
    Ok(read_header_and_meta(media, creation_id, offset, capacity)?.map(|(info, _)| info))
}

/// `offset`, a free block about to be handed out for writing. The Release fence orders the
/// zero that the block's free stored in its meta word (before this, in this thread or in
/// the one whose free list passed the block on) before every store the new owner makes into
/// it: the writer's side of the sequence lock with which a reader outside any operation
/// learns that the block was reused while it read ([`Heap::is_current`], INV-READ-1). Free
/// on x86-64, where stores are never reordered with stores.
///
/// [`Heap::is_current`]: crate::Heap::is_current
#[inline]
fn hand_out(offset: u64) -> u64 {
    // ORDERING: Release; see above. A reader that reads any store of the new owner and
    // then issues an Acquire fence sees the zero, or a later meta word, after it.
    fence(Ordering::Release);
    offset
}

/// [`read_header`], with the meta word it read.
#[allow(clippy::inline_always)]
#[inline(always)]
pub(crate) fn read_header_and_meta(
    media: &Media,
    creation_id: u64,
    offset: u64,
    capacity: u64,
) -> Result<Option<(BlockInfo, u64)>> {
    let meta = media.load(offset)?;
    if meta == 0 {
        return Ok(None);
    }
    // The body words after the meta word (whose Acquire load orders these after it).
    let [epoch, uid, type_id, owner_len] = media.load_words(offset + 8)?;
    let words = [meta, epoch, uid, type_id, owner_len];
    Ok(RawHeader::decode(words, offset, creation_id)
        .and_then(|raw| BlockInfo::from_raw(PBlock(offset), raw, capacity))
        .map(|info| (info, meta)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::layout::SPAN_SIZE;
    use crate::{Heap, HeapConfig};

    /// A heap in memory, and the size class of a 100-byte payload (not the anti-blocks').
    fn heap_and_class() -> (Heap, u8) {
        let heap = Heap::create(&HeapConfig::in_memory(16 * SPAN_SIZE)).unwrap();
        (heap, class_for(HEADER_LEN + TRAILER_LEN + 100).unwrap())
    }

    /// `reuse` hands each class's blocks to its pool in the order it was given them (the
    /// advance gives them highest address first, so that the pools, stacks, hand out the
    /// lowest first), fills the delete reserve from the last of the anti-blocks, leaves the
    /// caller's vector empty with its capacity, and gives large blocks' spans back.
    #[test]
    fn reuse_gives_each_class_its_blocks_in_order_and_the_reserve_the_last_anti_blocks() {
        let (heap, small) = heap_and_class();
        let (alloc, media) = (&heap.shared().runtime.alloc, &heap.shared().runtime.media);
        assert_ne!(small, ANTI_CLASS);
        // Fresh carvings: blocks no cache or pool holds.
        let antis = alloc.carve(media, ANTI_CLASS, 0).unwrap();
        let smalls = alloc.carve(media, small, 100).unwrap();
        let (anti_pool, small_pool) = (
            lock(&alloc.class_pools[usize::from(ANTI_CLASS)]).len(),
            lock(&alloc.class_pools[usize::from(small)]).len(),
        );
        // The reserve was filled at create; leave room for three.
        let kept = {
            let mut reserve = lock(&alloc.reserve);
            assert_eq!(reserve.len(), RESERVE_BLOCKS);
            let kept = reserve.len() - 3;
            reserve.truncate(kept);
            kept
        };
        let large_span = alloc.take_spans(media, 2, 0).unwrap();
        let free_spans = lock(&alloc.span_pool).len();
        let pending_of = |offset: u64| Pending {
            offset,
            place: alloc.locate(offset).unwrap(),
        };
        let mut pending: Vec<Pending> = vec![
            pending_of(smalls[4]),
            pending_of(antis[7]),
            pending_of(smalls[1]),
            pending_of(antis[2]),
            pending_of(antis[9]),
            Pending {
                offset: alloc.geometry.span_start(large_span),
                place: Place::Large {
                    span: large_span,
                    extent: 2,
                },
            },
            pending_of(antis[5]),
            pending_of(antis[3]),
            pending_of(smalls[8]),
        ];
        pending.reserve(100);
        let capacity = pending.capacity();
        alloc.reuse(&mut pending);
        assert!(pending.is_empty());
        assert_eq!(pending.capacity(), capacity);
        let reserve = lock(&alloc.reserve);
        assert_eq!(reserve.len(), RESERVE_BLOCKS);
        assert_eq!(reserve[kept..], [antis[9], antis[5], antis[3]]);
        drop(reserve);
        assert_eq!(
            lock(&alloc.class_pools[usize::from(ANTI_CLASS)])[anti_pool..],
            [antis[7], antis[2]]
        );
        assert_eq!(
            lock(&alloc.class_pools[usize::from(small)])[small_pool..],
            [smalls[4], smalls[1], smalls[8]]
        );
        assert_eq!(lock(&alloc.span_pool).len(), free_spans + 2);
    }

    /// An invalidation that fails appends nothing to the caller's list, so that no block
    /// the heap did not invalidate is ever reused.
    #[test]
    fn a_failed_invalidation_appends_nothing() {
        let (heap, small) = heap_and_class();
        let (alloc, media) = (&heap.shared().runtime.alloc, &heap.shared().runtime.media);
        let blocks = alloc.carve(media, small, 100).unwrap();
        let mut pending = vec![Pending {
            offset: blocks[0],
            place: alloc.locate(blocks[0]).unwrap(),
        }];
        // The second block is not a block start: `locate` refuses it after the first was
        // invalidated.
        let given = [PBlock(blocks[1]), PBlock(blocks[2] + 8)];
        assert!(alloc.invalidate(media, &given, &mut pending).is_err());
        assert_eq!(pending.len(), 1);
        alloc
            .invalidate(media, &[PBlock(blocks[1])], &mut pending)
            .unwrap();
        assert_eq!(
            pending.iter().map(|p| p.offset).collect::<Vec<_>>(),
            [blocks[0], blocks[1]]
        );
    }
}
