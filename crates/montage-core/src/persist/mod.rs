//! The persistence layer: every store into the heap, every write-back and every fence goes
//! through [`Media`], which pairs the mapped [`Region`] with the backend chosen at open.
//!
//! The backend is an enum fixed for the heap's lifetime, so each call is one well-predicted
//! branch on its tag; on the `Pmem`, `Eadr` and `Volatile` arms a store is a plain store to
//! the mapping. Only the simulator intercepts stores (it must log them), and only the journal
//! backend checks its poison flag on the write path.

pub(crate) mod journal;
pub(crate) mod pages;
#[cfg(any(test, feature = "sim"))]
pub(crate) mod sim;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
pub(crate) mod x86;

#[cfg(any(test, feature = "sim"))]
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::base::region::Region;
use crate::config::{BackendKind, HeapConfig};
use crate::error::{Error, Result};
use journal::{Journal, Ticket};
use pages::Pages;
#[cfg(any(test, feature = "sim"))]
use sim::Simulator;

pub(crate) use crate::base::layout::CACHE_LINE;

/// The most lines [`Media::prefetch_for_write`] asks for: past that the hardware's own
/// prefetcher has seen the stream of stores, and more requests would only queue behind the
/// core's few outstanding misses.
const PREFETCH_LINES: usize = 16;

/// The backend of one open heap.
#[derive(Debug)]
pub(crate) enum Backend {
    #[cfg(target_arch = "x86_64")]
    Pmem(x86::FlushInstr),
    Eadr,
    /// A file with a redo journal. Built by the opener (it needs the files), never by
    /// [`Backend::new`].
    Journal(Box<Journal>),
    Volatile,
    #[cfg(any(test, feature = "sim"))]
    Simulated(Arc<Simulator>),
}

impl Backend {
    /// The backend `config` asks for; `initial` is the simulator's starting durable image.
    /// Fails only where the backend cannot run (the pmem backend off x86-64).
    #[cfg_attr(target_arch = "x86_64", allow(clippy::unnecessary_wraps))]
    #[cfg_attr(not(any(test, feature = "sim")), allow(unused_variables))]
    pub(crate) fn new(config: &HeapConfig, initial: impl FnOnce() -> Pages) -> Result<Backend> {
        Ok(match config.backend {
            #[cfg(target_arch = "x86_64")]
            BackendKind::Pmem => Backend::Pmem(x86::detect()),
            #[cfg(not(target_arch = "x86_64"))]
            BackendKind::Pmem => {
                return Err(Error::Unsupported {
                    what: "the pmem backend needs x86-64 cache-line write-back instructions",
                });
            }
            BackendKind::Eadr => Backend::Eadr,
            BackendKind::Journal => {
                return Err(Error::InvalidConfig {
                    what: "the journal backend is built with its files",
                });
            }
            BackendKind::Volatile => Backend::Volatile,
            #[cfg(any(test, feature = "sim"))]
            BackendKind::Simulated(mode) => {
                let sim = Simulator::new(mode, initial(), None);
                if let Some(step) = config.sim_crash_at {
                    sim.crash_at(step);
                }
                Backend::Simulated(Arc::new(sim))
            }
        })
    }
}

/// The heap's bytes together with the backend that makes them durable.
#[derive(Debug)]
pub(crate) struct Media {
    region: Region,
    backend: Backend,
    /// The heap file (a duplicate of the heap's descriptor), which [`extend`](Self::extend)
    /// lengthens; `None` for a heap in memory.
    file: Option<(std::fs::File, std::path::PathBuf)>,
}

impl Media {
    pub(crate) fn new(region: Region, backend: Backend) -> Media {
        Media {
            region,
            backend,
            file: None,
        }
    }

    /// This media, lengthening the heap file (and its path), if the heap has one, when the
    /// heap grows.
    pub(crate) fn with_file(
        self,
        file: Option<&(std::fs::File, std::path::PathBuf)>,
    ) -> Result<Media> {
        let Some((file, path)) = file else {
            return Ok(self);
        };
        let file = file.try_clone().map_err(|e| Error::io("dup", path, e))?;
        Ok(Media {
            file: Some((file, path.clone())),
            ..self
        })
    }

    /// Makes the first `len` bytes of the heap usable: on a file, allocates them on the disk
    /// and makes the file's new length durable; then lets the mapping reach them. A heap
    /// already that long is left as it is.
    ///
    /// # Errors
    ///
    /// [`Error::NoDiskSpace`] if the disk is full, [`Error::OutOfSpace`] if the mapping
    /// reserves fewer bytes (the file may then be longer than before, which nothing reads);
    /// [`Error::Io`] if the file cannot be lengthened or synced.
    pub(crate) fn extend(&self, len: u64) -> Result<()> {
        let now = self.region.len() as u64;
        if len <= now {
            return Ok(());
        }
        let bytes = usize::try_from(len).map_err(|_| Error::BadSize {
            size: len,
            why: "larger than the address space",
        })?;
        if bytes > self.region.reserved() {
            return Err(Error::OutOfSpace {
                requested: len - now,
                free_spans: 0,
                free_bytes: 0,
            });
        }
        if let Some((file, path)) = &self.file {
            allocate_file(file, path, now, len - now)?;
            // PERSIST: the file's new length is durable before the span count names it.
            file.sync_data()
                .map_err(|e| Error::io("fdatasync", path, e))?;
        }
        #[cfg(any(test, feature = "sim"))]
        if let Some(sim) = self.simulator() {
            sim.extend(len);
        }
        self.region.grow(bytes)
    }

    pub(crate) fn region(&self) -> &Region {
        &self.region
    }

    /// The mapped bytes, without the backend (which is dropped).
    pub(crate) fn into_region(self) -> Region {
        self.region
    }

    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn simulator(&self) -> Option<&Arc<Simulator>> {
        match &self.backend {
            Backend::Simulated(sim) => Some(sim),
            Backend::Journal(journal) => match journal.device() {
                journal::device::Device::Sim(sim) => Some(sim),
                journal::device::Device::File { .. } => None,
            },
            _ => None,
        }
    }

    /// The journal, on the journal backend.
    pub(crate) fn journal(&self) -> Option<&Journal> {
        match &self.backend {
            Backend::Journal(journal) => Some(journal),
            _ => None,
        }
    }

    /// Fails if an earlier write-back failed (file backends only).
    #[inline]
    fn check_poison(&self) -> Result<()> {
        match &self.backend {
            Backend::Journal(journal) if journal.is_poisoned() => Err(Error::Poisoned),
            _ => Ok(()),
        }
    }

    /// Loads the word at `offset` with Acquire ordering.
    #[inline]
    pub(crate) fn load(&self, offset: u64) -> Result<u64> {
        self.load_words(offset).map(|[word]| word)
    }

    /// Loads the `N` consecutive words from `offset`, in order, each with Acquire ordering,
    /// with one bounds check.
    #[inline]
    pub(crate) fn load_words<const N: usize>(&self, offset: u64) -> Result<[u64; N]> {
        let words = self.region.words(offset, N)?;
        // ORDERING: Acquire pairs with the Release in `store`: whoever sees a header or
        // directory word also sees the fields written before it.
        Ok(std::array::from_fn(|i| {
            u64::from_le(words[i].load(Ordering::Acquire))
        }))
    }

    /// Stores `value` into the word at `offset` with Release ordering.
    #[inline]
    pub(crate) fn store(&self, offset: u64, value: u64) -> Result<()> {
        self.store_words(offset, &[value])
    }

    /// Stores `values` into the consecutive words from `offset`, in order, each with Release
    /// ordering (as [`store`](Self::store) would one by one), with one bounds check.
    #[inline]
    pub(crate) fn store_words(&self, offset: u64, values: &[u64]) -> Result<()> {
        #[cfg(any(test, feature = "sim"))]
        if let Some(sim) = self.simulator() {
            self.check_poison()?;
            for (at, &value) in (offset..).step_by(8).zip(values) {
                // ORDERING: Release pairs with the Acquire in `load`.
                sim.store(&self.region, at, value.to_le(), Ordering::Release)?;
            }
            return Ok(());
        }
        self.check_poison()?;
        for (word, &value) in self.region.words(offset, values.len())?.iter().zip(values) {
            // ORDERING: Release pairs with the Acquire in `load`.
            word.store(value.to_le(), Ordering::Release);
        }
        Ok(())
    }

    /// Stores a block header with one bounds check: `body` into the four words after
    /// `offset`, then `meta` into the word at `offset`, each with Release ordering, as
    /// [`store_words`](Self::store_words) of the body and [`store`](Self::store) of the meta
    /// word would. The meta word goes last: it is what makes the header valid (INV-HDR-1).
    #[inline]
    pub(crate) fn store_header(&self, offset: u64, body: &[u64; 4], meta: u64) -> Result<()> {
        #[cfg(any(test, feature = "sim"))]
        if self.simulator().is_some() {
            self.store_words(offset + 8, body)?;
            return self.store(offset, meta);
        }
        self.check_poison()?;
        self.region
            .store_header(offset, &body.map(u64::to_le), meta.to_le())
    }

    /// Compare-and-swap on the word at `offset`: `Ok(Ok(previous))` on success,
    /// `Ok(Err(actual))` when the word did not hold `current`.
    pub(crate) fn compare_exchange(
        &self,
        offset: u64,
        current: u64,
        new: u64,
    ) -> Result<Result<u64, u64>> {
        let (current, new) = (current.to_le(), new.to_le());
        #[cfg(any(test, feature = "sim"))]
        if let Some(sim) = self.simulator() {
            self.check_poison()?;
            let result = sim.compare_exchange(&self.region, offset, current, new)?;
            return Ok(result.map(u64::from_le).map_err(u64::from_le));
        }
        self.check_poison()?;
        // ORDERING: AcqRel publishes like `store` and observes like `load`.
        let result = self.region.word(offset)?.compare_exchange(
            current,
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        Ok(result.map(u64::from_le).map_err(u64::from_le))
    }

    /// Copies heap bytes at `offset` into `buf`.
    #[inline]
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.region.read(offset, buf)
    }

    /// The `len` heap bytes at `offset`, copied once into a new vector (see
    /// `Region::read_to_vec`).
    #[inline]
    pub(crate) fn read_to_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.region.read_to_vec(offset, len)
    }

    /// Copies `bytes` into the heap at `offset`.
    #[inline]
    pub(crate) fn write(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        #[cfg(any(test, feature = "sim"))]
        if let Some(sim) = self.simulator() {
            self.check_poison()?;
            return sim.write(&self.region, offset, bytes);
        }
        self.check_poison()?;
        self.region.write(offset, bytes)
    }

    /// Writes `payload` at `offset`, a block's payload, and right after it its trailer, the
    /// crc32c of `sum_words` and the payload (little-endian), with one check of the backend
    /// and one of the bounds; a short payload is checksummed as it is copied.
    #[inline]
    pub(crate) fn write_payload(
        &self,
        offset: u64,
        payload: &[u8],
        sum_words: &[u64; 2],
    ) -> Result<()> {
        #[cfg(any(test, feature = "sim"))]
        if self.simulator().is_some() {
            return self.write_payload_simulated(offset, payload, sum_words);
        }
        self.check_poison()?;
        self.region.write_payload(offset, payload, sum_words)
    }

    /// [`write_payload`](Self::write_payload) under the simulator: the payload, then the
    /// trailer, each a write it records.
    #[cfg(any(test, feature = "sim"))]
    fn write_payload_simulated(
        &self,
        offset: u64,
        payload: &[u8],
        sum_words: &[u64; 2],
    ) -> Result<()> {
        let trailer = crate::base::crc::words_then_bytes(sum_words, payload).to_le_bytes();
        self.write(offset, payload)?;
        self.write(offset + payload.len() as u64, &trailer)
    }

    /// Writes a new block at `offset`: its header ([`store_header`](Self::store_header)'s
    /// `body` and `meta`, the meta word after the body), then `payload` right after it and
    /// its trailer, the crc32c of `sum_words` and the payload (little-endian), after that,
    /// with one check of the backend and one of the bounds.
    #[inline]
    pub(crate) fn write_block(
        &self,
        offset: u64,
        body: &[u64; 4],
        meta: u64,
        payload: &[u8],
        sum_words: &[u64; 2],
    ) -> Result<()> {
        #[cfg(any(test, feature = "sim"))]
        if self.simulator().is_some() {
            // In the hardware path's order: the body, the payload and trailer, then the meta
            // word (a block handed out has a zero meta word until then: INV-ALLOC-1).
            self.store_words(offset + 8, body)?;
            self.write_payload_simulated(
                offset + crate::base::layout::HEADER_LEN,
                payload,
                sum_words,
            )?;
            return self.store(offset, meta);
        }
        self.check_poison()?;
        self.region.write_block(
            offset,
            &body.map(u64::to_le),
            meta.to_le(),
            payload,
            sum_words,
        )
    }

    /// Asks the CPU to bring the first `PREFETCH_LINES` lines of `[offset, offset + len)`
    /// into its cache for writing: the allocator calls it for the block it will hand out
    /// next, so that the stores into it (a block freed epochs ago, long out of the cache)
    /// do not each wait for a line. Only a hint; a range outside the heap is ignored.
    #[inline]
    pub(crate) fn prefetch_for_write(&self, offset: u64, len: u64) {
        self.prefetch_lines(offset, len, true);
    }

    /// Asks the CPU to start loading up to [`PREFETCH_LINES`] lines of `[offset, offset +
    /// len)`: a reader that must check a block's header before it knows what to copy issues
    /// this first, so that the payload's lines arrive while the header's is awaited instead
    /// of after it. Only a hint; a range outside the heap is ignored.
    #[inline]
    pub(crate) fn prefetch_for_read(&self, offset: u64, len: u64) {
        self.prefetch_lines(offset, len, false);
    }

    /// The prefetches above: `prefetchw` for `write`, else `prefetcht0`; nothing off x86-64.
    /// The lines' range is checked once, as a whole.
    #[inline]
    fn prefetch_lines(&self, offset: u64, len: u64, write: bool) {
        #[cfg(target_arch = "x86_64")]
        {
            if len == 0 {
                return;
            }
            let first = offset - offset % CACHE_LINE;
            let end = offset
                .saturating_add(len)
                .min(first.saturating_add(PREFETCH_LINES as u64 * CACHE_LINE));
            let Some(base) = self.region.addr_range(first, end - first) else {
                return;
            };
            for at in (0..end - first).step_by(CACHE_LINE as usize) {
                // Inside the range just checked: `at < end - first`.
                let addr = base.wrapping_add(at as usize);
                if write {
                    x86::prefetch_write(addr);
                } else {
                    x86::prefetch_read(addr);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (offset, len, write);
    }

    /// Starts writing back `[offset, offset + len)`. Nothing is guaranteed durable until this
    /// thread's next [`fence`](Self::fence).
    pub(crate) fn flush(&self, offset: u64, len: u64) -> Result<()> {
        self.region.check(offset, len)?;
        match &self.backend {
            #[cfg(target_arch = "x86_64")]
            Backend::Pmem(instr) => {
                for line in lines(offset, len) {
                    x86::flush_line(*instr, &self.region, line)?;
                }
                Ok(())
            }
            Backend::Eadr | Backend::Volatile => Ok(()),
            Backend::Journal(journal) => journal.flush(offset, len),
            #[cfg(any(test, feature = "sim"))]
            Backend::Simulated(sim) => {
                sim.flush(offset, len);
                Ok(())
            }
        }
    }

    /// [`flush`](Self::flush) of each range in `ranges`, in order, stopping at the first
    /// error: on the journal under one lock of its list of ranges (an advance hands it
    /// millions a second under a heavy load).
    pub(crate) fn flush_all(&self, ranges: &[(u64, u64)]) -> Result<()> {
        if let Backend::Journal(journal) = &self.backend {
            for &(offset, len) in ranges {
                self.region.check(offset, len)?;
            }
            return journal.flush_all(ranges);
        }
        for &(offset, len) in ranges {
            // PERSIST: the caller's fence, as for `flush`.
            self.flush(offset, len)?;
        }
        Ok(())
    }

    /// Waits until everything this thread flushed is durable.
    pub(crate) fn fence(&self) -> Result<()> {
        match &self.backend {
            #[cfg(target_arch = "x86_64")]
            Backend::Pmem(_) => {
                x86::sfence();
                Ok(())
            }
            #[cfg(target_arch = "x86_64")]
            Backend::Eadr => {
                x86::sfence();
                Ok(())
            }
            #[cfg(not(target_arch = "x86_64"))]
            Backend::Eadr => {
                // ORDERING: without x86's sfence, a full fence orders earlier stores (which
                // are durable once visible under eADR) before later ones.
                std::sync::atomic::fence(Ordering::SeqCst);
                Ok(())
            }
            Backend::Volatile => Ok(()),
            Backend::Journal(journal) => journal.fence(&self.region),
            #[cfg(any(test, feature = "sim"))]
            Backend::Simulated(sim) => {
                sim.fence();
                Ok(())
            }
        }
    }

    /// The end of an epoch advance: makes what was flushed ordered before the new epoch
    /// word `word`, and the word itself, persistent. On the journal backend the two go into
    /// one record that is written but not yet durable: the returned ticket is, once
    /// [`commit`](Self::commit)ted. On the other backends everything is durable on return
    /// (INV-EP-2).
    pub(crate) fn seal_epoch(&self, word: u64) -> Result<Ticket> {
        if let Backend::Journal(journal) = &self.backend {
            self.store(crate::base::layout::EPOCH_OFFSET, word)?;
            return journal.seal(&self.region, Some(word));
        }
        // PERSIST: INV-EP-2: everything flushed before is durable before the word can be.
        self.fence()?;
        self.store(crate::base::layout::EPOCH_OFFSET, word)?;
        // PERSIST: INV-EP-2: the word is durable before any operation can join its epoch.
        self.persist(crate::base::layout::EPOCH_OFFSET, 8)?;
        Ok(0)
    }

    /// The last ticket [`seal_epoch`](Self::seal_epoch) or a fence handed out.
    pub(crate) fn last_sealed(&self) -> Ticket {
        self.journal().map_or(0, Journal::last_sealed)
    }

    /// Whether `ticket` is durable.
    pub(crate) fn is_durable(&self, ticket: Ticket) -> bool {
        self.journal()
            .is_none_or(|journal| journal.is_durable(ticket))
    }

    /// Makes `ticket` durable (one device flush shared by concurrent callers).
    pub(crate) fn commit(&self, ticket: Ticket) -> Result<()> {
        match self.journal() {
            Some(journal) => journal.commit(ticket),
            None => Ok(()),
        }
    }

    /// Before recovery reads the heap: makes durable what a crashed process may have left
    /// dirty in the metadata area `[0, metadata_len)` and, for a journal heap, anywhere in
    /// the heap file (INV-REC-1). On persistent memory the block headers are written back one by one as
    /// the scan reads them ([`settle_header`](Self::settle_header)), so pages recovery never
    /// touches are not faulted in.
    pub(crate) fn settle_before_recovery(&self, metadata_len: u64) -> Result<()> {
        match &self.backend {
            // PERSIST: before the journal logs, a fence makes the whole heap file durable.
            Backend::Journal(journal) => journal.fence(&self.region),
            // PERSIST: superblock, directory and span table, before they are trusted.
            _ => self.persist(0, metadata_len),
        }
    }

    /// Before recovery reads them: makes `[offset, offset + len)` durable, as
    /// [`settle_before_recovery`](Self::settle_before_recovery) does the metadata area (the
    /// journal's fence there covered the whole file already). For the span tables of a grown
    /// heap's groups, which lie past the metadata area.
    pub(crate) fn settle_range(&self, offset: u64, len: u64) -> Result<()> {
        match &self.backend {
            Backend::Journal(_) => Ok(()),
            // PERSIST: INV-REC-1, for a range recovery is about to trust.
            _ => self.persist(offset, len),
        }
    }

    /// During recovery: starts writing back the header line the scan just read, so that
    /// what recovery decides on is durable (INV-REC-1); the scan worker's closing fence
    /// completes it. Only persistent memory needs it (see
    /// [`settle_before_recovery`](Self::settle_before_recovery)).
    #[inline]
    pub(crate) fn settle_header(&self, offset: u64) -> Result<()> {
        match &self.backend {
            #[cfg(target_arch = "x86_64")]
            Backend::Pmem(_) => self.flush(offset, crate::base::layout::HEADER_LEN),
            _ => Ok(()),
        }
    }

    /// Makes `[offset, offset + len)` persistent in order with everything flushed before and
    /// after it, for a store that only adds (a new span's entry): what depends on it is
    /// flushed later, so no durable state can hold that without it. Durable at once on every
    /// backend but the journal, where the range joins the flushed ranges in order and the
    /// next record holds it (no record is written here, so an allocating thread never waits
    /// for the advancer's copy).
    pub(crate) fn persist_ordered(&self, offset: u64, len: u64) -> Result<()> {
        match &self.backend {
            // PERSIST: in flush order, so in a record no later than anything flushed after.
            Backend::Journal(journal) => journal.flush(offset, len),
            _ => self.persist(offset, len),
        }
    }

    /// Flushes `[offset, offset + len)` and fences.
    pub(crate) fn persist(&self, offset: u64, len: u64) -> Result<()> {
        // PERSIST: the range is durable when this returns.
        self.flush(offset, len)?;
        // PERSIST: completes the flush above.
        self.fence()
    }
}

/// Allocates bytes `[offset, offset + len)` of the heap file `file` (at `path`) on the disk,
/// lengthening it if needed (see [`mapping::allocate`](crate::base::mapping::allocate)).
/// The range lies past the file's allocated bytes (a new file, a growth, a repair of a cut
/// file), so a file system with fewer than `len` bytes free cannot hold it: that is found
/// first, without filling the disk up to its last block before failing.
///
/// # Errors
///
/// [`Error::NoDiskSpace`] if the file system has too little free space, [`Error::Io`] for
/// another failure.
pub(crate) fn allocate_file(
    file: &std::fs::File,
    path: &std::path::Path,
    offset: u64,
    len: u64,
) -> Result<()> {
    let no_space = |available| Error::NoDiskSpace {
        path: path.to_path_buf(),
        needed: len,
        available,
    };
    let available = crate::base::mapping::free_space(file);
    if let Some(available) = available.filter(|&available| available < len) {
        return Err(no_space(available));
    }
    match crate::base::mapping::allocate(file, offset, len) {
        Ok(()) => Ok(()),
        // The check above passed, or the file system could not say: what is free now.
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => Err(no_space(
            crate::base::mapping::free_space(file).unwrap_or(0),
        )),
        Err(e) => Err(Error::io("fallocate", path, e)),
    }
}

/// Asks the CPU to bring the cache line `item` begins on into its cache, for a caller that
/// will read it soon (on x86-64; nothing elsewhere). Only a hint.
#[inline]
pub(crate) fn prefetch_for_read<T>(item: &T) {
    #[cfg(target_arch = "x86_64")]
    x86::prefetch_read(std::ptr::from_ref(item).cast::<u8>());
    #[cfg(not(target_arch = "x86_64"))]
    let _ = item;
}

/// Asks the CPU to bring the line at `ptr` into its cache for writing (on x86-64; nothing
/// elsewhere): for memory a thread will write soon and has not touched for long. Only a
/// hint; any address will do.
#[inline]
pub(crate) fn prefetch_ptr_for_write(ptr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    x86::prefetch_write(ptr);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

/// Asks the CPU to bring the cache line two lines past the end of `items` into its cache for
/// writing: for a log that grows by a few entries per operation and that another thread
/// (the advancer) read last, so that the stores of the next operations find their lines
/// rather than each wait for one. Only a hint; the address may lie past the allocation.
#[inline]
pub(crate) fn prefetch_tail_for_write<T>(items: &[T]) {
    #[cfg(target_arch = "x86_64")]
    x86::prefetch_write(
        items
            .as_ptr()
            .wrapping_add(items.len())
            .cast::<u8>()
            .wrapping_add(2 * CACHE_LINE as usize),
    );
    #[cfg(not(target_arch = "x86_64"))]
    let _ = items;
}

/// The start offsets of the cache lines that `[offset, offset + len)` touches. The end is
/// computed before the start is rounded down, so an unaligned range never loses its last line.
pub(crate) fn lines(offset: u64, len: u64) -> impl Iterator<Item = u64> {
    let end = offset.saturating_add(len);
    let first = if len == 0 {
        end
    } else {
        offset - offset % CACHE_LINE
    };
    (first..end).step_by(CACHE_LINE as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn range_ending_on_a_line_boundary_touches_no_extra_line() {
        assert_eq!(lines(0, 64).collect::<Vec<_>>(), vec![0]);
        assert_eq!(lines(64, 128).collect::<Vec<_>>(), vec![64, 128]);
        assert_eq!(lines(63, 2).collect::<Vec<_>>(), vec![0, 64]);
        assert_eq!(lines(10, 0).count(), 0);
    }

    proptest! {
        #[test]
        fn lines_cover_exactly_the_touched_lines(offset in 0u64..10_000, len in 0u64..1_000) {
            let got: Vec<u64> = lines(offset, len).collect();
            let want: Vec<u64> = (offset..offset + len)
                .map(|byte| byte / CACHE_LINE * CACHE_LINE)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            prop_assert_eq!(got, want);
        }
    }
}
