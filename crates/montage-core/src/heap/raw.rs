//! The raw block layer: allocate, write, free and write back blocks directly, and open a
//! heap with a recovery decision of the caller's. It is outside the buffered-durable
//! contract (see [`RawHeap`]); structures use operations instead.

use super::Heap;
use crate::alloc::block::BlockView;
use crate::alloc::block::PBlock;
use crate::base::layout::{HEADER_LEN, LEN_WORD_OFFSET};
use crate::config::HeapConfig;
use crate::error::{Error, Result};
#[cfg(any(test, feature = "sim"))]
use crate::persist::sim::CrashImage;

pub use crate::alloc::block::BlockSpec;
pub use crate::recovery::Verdict;

/// A view of a heap's blocks without operations or epochs: [`Heap::raw`].
///
/// Nothing here follows the buffered-durable contract. A block written through this view
/// carries whatever epoch and uid its [`BlockSpec`] names, is durable only once
/// [`persist_block`](Self::persist_block) (or a flush and a [`fence`](Self::fence)) covers
/// it, and is kept or dropped at the next open by the recovery rule of whoever opens the
/// heap: [`Heap::open`]'s epoch rule, or the caller's with [`open_with`]. Mixing raw writes
/// with operations on the same structure voids both contracts. It exists for tools, tests
/// of the heap layer, and structures that manage block lifetimes themselves.
///
/// The epoch rule also checks the blocks against the stored clock, so raw blocks meant for
/// it must carry epochs the clock could have written: [`Heap::open`] refuses, as damaged,
/// a heap with a block newer than its epoch word (on persistent memory), or, after a clean
/// close, newer than the word minus two. Block uids are at most 2^62 whatever the rule.
#[derive(Debug, Clone, Copy)]
pub struct RawHeap<'h> {
    heap: &'h Heap,
}

impl Heap {
    /// The raw block layer of this heap (see [`RawHeap`]).
    pub fn raw(&self) -> RawHeap<'_> {
        RawHeap { heap: self }
    }
}

impl RawHeap<'_> {
    /// Allocates a block for `len` payload bytes with the header `spec`. The payload starts
    /// out with whatever the block held before; nothing is durable until
    /// [`persist_block`](Self::persist_block) or a flush and fence cover it.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfSpace`] when the heap cannot fit the block; [`Error::Poisoned`] after a
    /// failed write-back.
    pub fn alloc(&self, spec: BlockSpec, len: u64) -> Result<PBlock> {
        let runtime = &self.heap.shared().runtime;
        runtime.epochs.check_open()?;
        runtime.writable()?;
        runtime.alloc.alloc(
            &runtime.media,
            &runtime.epochs.outside_op_caches(),
            spec,
            len,
        )
    }

    /// Allocates a block holding `bytes`.
    ///
    /// # Errors
    ///
    /// As [`alloc`](Self::alloc).
    pub fn alloc_bytes(&self, spec: BlockSpec, bytes: &[u8]) -> Result<PBlock> {
        let block = self.alloc(spec, bytes.len() as u64)?;
        self.heap
            .shared()
            .runtime
            .media
            .write(block.payload_offset(), bytes)?;
        Ok(block)
    }

    /// Frees `block`. Its header is invalidated at once; the block is reused only after the
    /// invalidation is durable, so a crash can never bring its old contents back.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlock`] if `block` is not a live block (a double free).
    pub fn free(&self, block: PBlock) -> Result<()> {
        let runtime = &self.heap.shared().runtime;
        runtime.epochs.check_open()?;
        runtime.writable()?;
        runtime
            .alloc
            .free(&runtime.media, &runtime.epochs.outside_op_caches(), block)
    }

    /// Writes `bytes` into `block`'s payload at byte `at`.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfBounds`] if the range leaves the block's capacity;
    /// [`Error::InvalidBlock`] if `block` is not a block of this heap.
    pub fn write(&self, block: PBlock, at: u64, bytes: &[u8]) -> Result<()> {
        let runtime = &self.heap.shared().runtime;
        runtime.epochs.check_open()?;
        runtime.writable()?;
        let offset = self.payload_range(block, at, bytes.len() as u64)?;
        runtime.media.write(offset, bytes)
    }

    /// Reads `buf.len()` bytes of `block`'s payload from byte `at`.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write).
    pub fn read(&self, block: PBlock, at: u64, buf: &mut [u8]) -> Result<()> {
        let offset = self.payload_range(block, at, buf.len() as u64)?;
        self.heap.shared().runtime.media.read(offset, buf)
    }

    fn payload_range(self, block: PBlock, at: u64, len: u64) -> Result<u64> {
        let capacity = self.heap.shared().runtime.alloc.capacity(block)?;
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
        let shared = self.heap.shared();
        let runtime = &shared.runtime;
        // A valid block gets its payload checksum first, as the epoch advance gives it to the
        // blocks operations write (INV-SUM-1).
        if let Some((offset, len)) =
            runtime
                .alloc
                .seal_payload(&runtime.media, block, None, &mut Vec::new())?
        {
            // PERSIST: header, payload and trailer start their write-back; the caller's
            // fence completes it.
            return runtime.media.flush(offset, len);
        }
        let capacity = shared.runtime.alloc.capacity(block)?;
        // The recorded length bounds the write-back; the header is not validated here, which
        // a flush does not need (a bad length only flushes more or less of this block).
        let recorded = shared
            .runtime
            .media
            .load(block.offset() + LEN_WORD_OFFSET)?
            >> 32;
        let len = recorded.min(capacity);
        // PERSIST: header and payload start their write-back; the caller's fence completes it.
        shared.runtime.media.flush(block.offset(), HEADER_LEN + len)
    }

    /// Waits until everything this thread flushed is durable.
    ///
    /// # Errors
    ///
    /// [`Error::WriteBack`] if a file write or flush fails (the heap is poisoned from then on), or
    /// [`Error::Poisoned`] after an earlier failure.
    pub fn fence(&self) -> Result<()> {
        // PERSIST: completes this thread's earlier flushes.
        self.heap.shared().runtime.media.fence()
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
}

/// Opens an existing heap file with a recovery decision of the caller's instead of the
/// epoch rule, for tools and tests that manage block lifetimes themselves: `decide` sees
/// every valid block and says whether it lives. Dropped blocks are durably invalidated
/// before this returns.
///
/// # Errors
///
/// As [`Heap::open`].
pub fn open_with(
    config: &HeapConfig,
    decide: impl Fn(&BlockView<'_>) -> Verdict + Sync,
) -> Result<Heap> {
    Heap::open_file(config, super::open::Policy::Custom(&decide))
}

/// [`open_with`] for a crash image, as [`Heap::open_image`] opens one. With the `sim`
/// feature only.
///
/// # Errors
///
/// As [`Heap::open`], for the image's contents.
#[cfg(any(test, feature = "sim"))]
pub fn open_image_with(
    image: CrashImage,
    config: &HeapConfig,
    decide: impl Fn(&BlockView<'_>) -> Verdict + Sync,
) -> Result<Heap> {
    Heap::open_image_policy(image, config, super::open::Policy::Custom(&decide))
}
