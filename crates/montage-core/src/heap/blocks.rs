//! Reading blocks outside operations: a block's header, its payload, and the parallel scan
//! with which a structure finds its payloads when it opens.

use std::sync::{Mutex, PoisonError};

use super::Heap;
use crate::alloc::block::{BlockInfo, BlockKind, BlockView, OwnerId, PBlock};
use crate::base::layout::META_RETIRED;
use crate::error::Result;
use crate::recovery::scan::{self, UnitVisit};

/// Which blocks a [`Heap::scan`] visits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanFilter {
    /// Only blocks of this owner.
    pub owner: Option<OwnerId>,
    /// Only blocks of this type id.
    pub type_id: Option<u64>,
    /// Only blocks no committed operation has superseded or deleted (see
    /// [`live`](Self::live)).
    pub live: bool,
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

    /// Only blocks that are the current version of their payload: not superseded or deleted
    /// by an operation that committed while the heap is open (whose old versions stay valid,
    /// with their retired bit set, until reclamation). A structure that opens on a heap that
    /// has been running rebuilds from these; right after recovery every valid block is live.
    #[must_use]
    pub fn live(mut self) -> ScanFilter {
        self.live = true;
        self
    }

    pub(crate) fn matches(&self, info: &BlockInfo) -> bool {
        self.owner.is_none_or(|o| o == info.spec.owner)
            && self.type_id.is_none_or(|t| t == info.spec.type_id)
    }
}

impl Heap {
    /// The handle of the live block whose header is at `offset` (for handles stored as
    /// plain offsets, for example inside other payloads).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlock`](crate::Error::InvalidBlock) unless a live block starts at `offset`.
    pub fn block_at(&self, offset: u64) -> Result<PBlock> {
        let block = PBlock(offset);
        self.info(block).map(|_| block)
    }

    /// The header of a live block.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlock`](crate::Error::InvalidBlock) if `block` is not a live block of this heap.
    pub fn info(&self, block: PBlock) -> Result<BlockInfo> {
        self.shared()
            .runtime
            .alloc
            .header(&self.shared().runtime.media, block)
    }

    /// [`info`](Self::info) for a caller about to read the payload (see
    /// `Allocator::header_for_read`).
    fn info_for_read(&self, block: PBlock) -> Result<BlockInfo> {
        self.info_and_meta_for_read(block).map(|(info, _)| info)
    }

    /// [`info_for_read`](Self::info_for_read), with the meta word the header was read with.
    fn info_and_meta_for_read(&self, block: PBlock) -> Result<(BlockInfo, u64)> {
        let runtime = &self.shared().runtime;
        runtime.alloc.header_for_read(&runtime.media, block)
    }

    /// A live block's header, with a reader of its payload: one header check for several
    /// reads of parts of the payload (read as [`read_payload`](Self::read_payload) reads,
    /// with the same caveats outside an operation).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBlock`](crate::Error::InvalidBlock) if `block` is not a live block.
    pub fn view(&self, block: PBlock) -> Result<BlockView<'_>> {
        let (info, meta) = self.info_and_meta_for_read(block)?;
        self.verify_payload(&info)?;
        Ok(BlockView::new(info, &self.shared().runtime.media, meta))
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
    /// [`Error::InvalidBlock`](crate::Error::InvalidBlock) if `block` is not a live block.
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
        let info = self.info_for_read(block)?;
        self.verify_payload(&info)?;
        buf.resize(info.len as usize, 0);
        self.shared()
            .runtime
            .media
            .read(block.payload_offset(), buf)
    }

    /// With [`HeapConfig::verify_reads`](crate::HeapConfig::verify_reads), checks the payload
    /// `info` describes against its checksum, unless it was written in the last two epochs.
    fn verify_payload(&self, info: &BlockInfo) -> Result<()> {
        let runtime = &self.shared().runtime;
        runtime.verify_payload(info, || runtime.epochs.current().durable_cut())
    }

    /// Visits every valid block matching `filter`, in parallel over the heap's spans. Blocks
    /// allocated or freed while the scan runs may or may not be seen; blocks recovery
    /// quarantined ([`RecoveryReport::quarantined`](crate::RecoveryReport::quarantined)) are
    /// never. Returns how many blocks were visited.
    ///
    /// A scan runs in no operation, so while operations run, a block it visits can be
    /// freed and handed out again between the scan's read of its header and `visit`'s read
    /// of its payload: `visit` would read the next payload under the old header. A visitor
    /// that reads payloads while operations may change the blocks it visits reads first and
    /// then asks [`is_current`](Self::is_current), and drops what it read if the answer is
    /// no (the block was freed and handed out again in the meantime);
    /// [`scan_payloads`](Self::scan_payloads) does that for a visitor of whole payloads.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupted`](crate::Error::Corrupted) if the span table is damaged; any error `visit` returns.
    pub fn scan(
        &self,
        filter: ScanFilter,
        threads: usize,
        visit: impl Fn(&BlockView<'_>) -> Result<()> + Sync,
    ) -> Result<u64> {
        let geometry = self.shared().runtime.alloc.geometry();
        let units = scan::read_span_table(&self.shared().runtime.media, &geometry, false)?.units;
        let progress = scan::Progress::new(&units, 1, None);
        let work = |unit: UnitVisit<'_>| -> Result<u64> {
            let mut seen = 0;
            for (_, view) in &unit.blocks {
                let Some(view) = view else { continue };
                if !self.in_state(view, filter.live)? {
                    continue;
                }
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
        };
        let counts = scan::scan(
            &self.shared().runtime.media,
            &geometry,
            &units,
            options,
            &progress,
            &work,
            &|| Ok(()),
        )?;
        Ok(counts.into_iter().sum())
    }

    /// [`scan`](Self::scan) for a visitor of payloads: `visit` gets the header and the whole
    /// payload of every matching block but anti-blocks (which hold none), read into a buffer
    /// of the scanning thread. A block freed and handed out again between the scan's read of
    /// its header and the read of its payload is left out ([`is_current`](Self::is_current)).
    ///
    /// # Errors
    ///
    /// As [`scan`](Self::scan).
    pub fn scan_payloads(
        &self,
        filter: ScanFilter,
        threads: usize,
        visit: impl Fn(&BlockInfo, &[u8]) -> Result<()> + Sync,
    ) -> Result<()> {
        thread_local! {
            static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        self.scan(filter, threads, |view| {
            let info = view.info();
            if info.spec.kind == BlockKind::Delete {
                return Ok(());
            }
            let read = |bytes: &mut Vec<u8>| {
                bytes.resize(info.len as usize, 0);
                view.read(0, bytes)?;
                if !self.is_current(view)? {
                    return Ok(());
                }
                visit(info, bytes)
            };
            // A visitor that scans again on this thread gets a buffer of its own.
            BUFFER.with(|buffer| match buffer.try_borrow_mut() {
                Ok(mut bytes) => read(&mut bytes),
                Err(_) => read(&mut Vec::new()),
            })
        })
        .map(|_| ())
    }

    /// Whether the block `view` shows still holds the version whose header the view read,
    /// so that what was read of its payload through the view before this call belongs to
    /// that version, not to a later owner of the block (a [`scan`](Self::scan)'s visitor
    /// asks after it reads; see there). A version that was retired since (replaced or
    /// deleted, not yet freed) is still current. A block's meta word never takes a value it
    /// had before (it covers the block's unique id), and it is zero between a block's free
    /// and its next header, so an unchanged word means that no one freed the block and
    /// handed it out again in between. Like every read outside an operation (see
    /// [`read_payload`](Self::read_payload)), the read may still show a version that an
    /// operation was writing, in part.
    ///
    /// # Errors
    ///
    /// A heap error reading the meta word.
    pub fn is_current(&self, view: &BlockView<'_>) -> Result<bool> {
        // ORDERING: the caller's reads of the payload come before the meta word's load
        // below: the reader's side of a sequence lock, whose writer stores the zero that
        // frees a block before the block is handed out again.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        self.meta_unchanged(view)
    }

    /// [`is_current`](Self::is_current) for a caller that has issued its Acquire fence.
    fn meta_unchanged(&self, view: &BlockView<'_>) -> Result<bool> {
        let now = self
            .shared()
            .runtime
            .media
            .load(view.info().block.offset())?;
        Ok(now & !META_RETIRED == view.header_meta() & !META_RETIRED)
    }

    /// Reads the block a lock-free index names, outside any operation: `read` gets a view of
    /// `block`, and what it returns is kept only if, after it, `still_named` says the index
    /// still names `block` and the block still holds the version whose header the view
    /// read ([`is_current`](Self::is_current)). Then what `read` returned was read from the
    /// version the index named at `still_named`'s load, which is where such a read
    /// linearizes. `None` when either check fails, when `block` held no valid header as the
    /// view was taken (freed, or being written), or when `read` failed: the caller reads
    /// again inside an operation, which waits for nothing and reports real damage.
    ///
    /// What the index promises (INV-READ-1): it names a block only once a version is written
    /// in it whole (every allocation writes the meta word last), it never changes a version
    /// it names (a new version goes into a new block), and it frees the block only after it
    /// stops naming it, through the epochs' reclamation (`OpGuard::delete`, never the
    /// `_unshared` deletes, which hand a block out again at once to readers that hold a
    /// lock). `read` may see bytes of a later owner of the block, since nothing keeps the
    /// block from being freed and handed out again while it reads; it must be safe for any
    /// bytes (a [`Codec`](crate::Codec)'s decode returns `None` for bytes it did not write),
    /// and this call then drops what it returned.
    pub fn read_named<T>(
        &self,
        block: PBlock,
        read: impl FnOnce(&BlockView<'_>) -> Result<T>,
        still_named: impl FnOnce() -> bool,
    ) -> Option<T> {
        #[cfg(feature = "sim")]
        race::reached(race::NamedReadPoint::Named, block);
        let view = self.view(block).ok()?;
        #[cfg(feature = "sim")]
        race::reached(race::NamedReadPoint::Viewed, block);
        let value = read(&view).ok()?;
        #[cfg(feature = "sim")]
        race::reached(race::NamedReadPoint::Read, block);
        // ORDERING: the payload's loads above come before the index's load in
        // `still_named` and the meta word's after it: had any of them read a store of the
        // block's next owner, which made it after the block was freed and so after the index
        // stopped naming it, both loads would see that (the allocator's Release fence as it
        // hands a block out pairs with this Acquire fence, as in `is_current`).
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        if !still_named() {
            return None;
        }
        self.meta_unchanged(&view).ok()?.then_some(value)
    }

    /// Whether the block `view` shows, whose header the scan found valid, is part of the
    /// heap's state for a scan: not quarantined, and, if `live`, still the version the scan
    /// read and not retired (replaced or deleted by an operation). Between the scan's read
    /// of a header and this check, reclamation may invalidate a retired block (its meta word
    /// is zero then) and the allocator may hand it out again (a new header): neither is the
    /// live version the scan found.
    pub(super) fn in_state(&self, view: &BlockView<'_>, live: bool) -> Result<bool> {
        let offset = view.info().block.offset();
        if self.shared().report.is_quarantined(offset) {
            return Ok(false);
        }
        if !live {
            return Ok(true);
        }
        let now = self.shared().runtime.media.load(offset)?;
        Ok(now == view.header_meta() && now & META_RETIRED == 0)
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
}

/// Where a test may stop a [`Heap::read_named`] to change the block under it (the `sim`
/// feature's [`sim::pause_named_reads_at`](crate::sim::pause_named_reads_at)).
#[cfg(feature = "sim")]
pub(crate) mod race {
    use crate::alloc::block::PBlock;

    /// A point in [`Heap::read_named`](crate::Heap::read_named).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum NamedReadPoint {
        /// The index named the block; nothing of it is read yet.
        Named,
        /// The block's header is read; its payload is not.
        Viewed,
        /// The payload is read; neither check has run.
        Read,
    }

    /// What a test runs at a [`NamedReadPoint`], given the block being read.
    pub type Hook = crate::race::Hook<(NamedReadPoint, PBlock)>;

    thread_local! {
        static HOOK: crate::race::Slot<(NamedReadPoint, PBlock)> =
            const { std::cell::RefCell::new(None) };
    }

    /// Calls `hook` on this thread at every [`NamedReadPoint`] its reads reach, until it is
    /// replaced (`None`: no more calls). Reads the hook itself makes do not call it.
    pub fn pause_named_reads_at(hook: Option<Hook>) {
        crate::race::set(&HOOK, hook);
    }

    pub(crate) fn reached(point: NamedReadPoint, block: PBlock) {
        crate::race::reached(&HOOK, (point, block));
    }
}

#[cfg(all(test, not(montage_loom)))]
mod tests {
    use crate::{EpochLength, Heap, HeapConfig, ScanFilter};

    /// A block freed and handed out again while a scan's visitor holds its view shows the
    /// next payload under the old header; `is_current` tells the visitor so. A version
    /// retired but not freed is still current, and so is an untouched block.
    #[test]
    fn a_visitor_learns_that_its_block_was_reused_while_it_read() {
        let config = HeapConfig::in_memory(1 << 20).epoch_length(EpochLength::Manual);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("t").unwrap();
        let alloc = |bytes: &[u8]| heap.run_op(|op| op.alloc(owner, 1, bytes)).unwrap();
        let older = alloc(b"an older version");
        heap.advance_epoch().unwrap();
        let reused = alloc(b"the first payload");
        let filter = ScanFilter::all().live().owner(owner);
        let seen = std::sync::Mutex::new(Vec::new());
        heap.scan(filter, 1, |view| {
            let block = view.info().block;
            if block == reused {
                // Freed in the epoch it was written in, and handed out at once to the next
                // allocation of its class (the collections' deletes do this).
                heap.run_op(|op| op.delete_unshared(block)).unwrap();
                assert_eq!(alloc(b"someone's payload"), block);
            } else {
                // Retired (an anti-block records the deletion), not freed.
                heap.run_op(|op| op.delete(block)).unwrap();
            }
            let mut bytes = vec![0; view.info().len as usize];
            view.read(0, &mut bytes).unwrap();
            let current = heap.is_current(view).unwrap();
            seen.lock().unwrap().push((block, bytes, current));
            Ok(())
        })
        .unwrap();
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        let mut want = vec![
            (older, b"an older version".to_vec(), true),
            (reused, b"someone's payload".to_vec(), false),
        ];
        want.sort();
        assert_eq!(seen, want);
    }
}
