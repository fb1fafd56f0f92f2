//! `Region`: the base pointer and length of one mapping, and the only code that turns heap
//! offsets into pointers. Every access is bounds-checked (and alignment-checked for words)
//! before the one unsafe step, and every access is atomic, so a bad offset or a racing
//! writer can at worst produce wrong bytes, never undefined behaviour (INV-MEM-1, INV-MEM-2).

#![deny(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::crc;
use super::mapping::Mapping;
use crate::error::{Error, Result};

/// From this many bytes on, [`Region::read`] and [`Region::write`] copy with one `rep movsb`
/// instead of a loop of word loads and stores: a 1 KiB value is then a few cache-line-wide
/// moves instead of 128 word moves. Below it the loop is as fast (and has no start-up cost
/// on CPUs without fast short string moves).
#[cfg(target_arch = "x86_64")]
const STRING_COPY_MIN: usize = 128;

/// Copies `len` bytes from `src` to `dst` with `rep movsb`.
///
/// Every byte is read and written once by a single-byte access, which x86-64 performs as one
/// indivisible access, so the copy is a sequence of relaxed atomic byte loads and stores:
/// racing with other threads' atomic accesses to the mapping is no data race (INV-MEM-2).
/// The stores of one string instruction may become visible out of order among themselves,
/// but never after a later store (Intel SDM vol. 3, 8.2.4.1: string operations are not
/// reordered with other stores), so a header or pointer stored with Release after the copy
/// publishes all of it, as it does after the word loop.
///
/// # Safety
///
/// `src` must be valid for reads of `len` bytes and `dst` valid for writes of `len` bytes,
/// the two ranges must not overlap, and any other access to either range while the copy
/// runs must be atomic.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn copy_string(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller guarantees the two ranges are valid and disjoint (# Safety); the
    // direction flag is clear on entry to an asm block (Rust reference, "Inline assembly",
    // rules for x86), so the copy runs upwards; the block touches only those ranges and the
    // three registers it declares.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags),
        );
    }
}

/// Copies the first `n` bytes of `src` (`n < 8`) to `dst` in at most three moves of 4, 2
/// and 1 bytes, not a byte loop or a call to `memcpy`.
///
/// # Safety
///
/// `dst` is valid for writes of `n` bytes.
#[inline]
unsafe fn copy_short(dst: *mut u8, src: [u8; 8], n: usize) {
    debug_assert!(n < 8);
    let mut at = 0usize;
    for chunk in [4, 2, 1] {
        if n & chunk != 0 {
            // SAFETY: the chunks taken add up to `n < 8`, so `[at, at + chunk)` lies inside
            // both `src` and `dst` (valid for `n` bytes, this function's contract), which
            // cannot overlap (`src` is a local copy).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr().wrapping_add(at),
                    dst.wrapping_add(at),
                    chunk,
                );
            }
            at = at.wrapping_add(chunk);
        }
    }
}

/// The bytes of `word`, as memory holds them, from its `from`th (`from < 8`) on.
#[inline]
fn bytes_from(word: u64, from: usize) -> [u8; 8] {
    // `from < 8`: the shift is under 64 bits.
    #[allow(clippy::cast_possible_truncation)]
    let bits = (from as u32).wrapping_mul(8);
    if cfg!(target_endian = "little") {
        word.wrapping_shr(bits).to_ne_bytes()
    } else {
        word.wrapping_shl(bits).to_ne_bytes()
    }
}

/// A mapped heap: base pointer plus length, with checked word and byte access. The mapping
/// may reserve more than the heap holds now (a heap that grows keeps its address); only the
/// first [`len`](Self::len) bytes are accessible, and [`grow`](Self::grow) makes more so.
#[derive(Debug)]
pub(crate) struct Region {
    base: NonNull<u8>,
    len: AtomicUsize,
    mapping: Mapping,
}

// SAFETY: `Region` only hands out atomics (`&AtomicU64`, `&AtomicU32`, `&AtomicU8`) into the mapping, which
// are `Sync`, and copies bytes through them; the raw base pointer is never dereferenced
// non-atomically, so sharing the region across threads cannot create a data race (INV-MEM-2).
unsafe impl Send for Region {}
// SAFETY: see the `Send` impl above.
unsafe impl Sync for Region {}

/// A block header's length: the meta word and the four body words.
const HEADER: usize = 40;
const _: () = assert!(HEADER as u64 == super::layout::HEADER_LEN);
/// A block trailer's length: the payload's crc32c.
const TRAILER: usize = 4;
const _: () = assert!(TRAILER as u64 == super::layout::TRAILER_LEN);

/// The error for an access to `[offset, offset + len)` outside the region, built out of line:
/// the checks that return it are inlined into every access.
#[cold]
fn out_of_bounds(offset: u64, len: u64) -> Error {
    Error::OutOfBounds { offset, len }
}

impl Region {
    /// Takes ownership of a mapping, all of it accessible. The mapping's base is at least
    /// page-aligned.
    #[cfg(test)]
    pub(crate) fn new(mapping: Mapping) -> Region {
        let len = mapping.len();
        Self::with_len(mapping, len)
    }

    /// Takes ownership of a mapping of which the first `len` bytes (at most its length) are
    /// accessible; the rest is reserved for [`grow`](Self::grow).
    pub(crate) fn with_len(mapping: Mapping, len: usize) -> Region {
        mapping.backed(len);
        Region {
            base: mapping.base(),
            len: AtomicUsize::new(len.min(mapping.len())),
            mapping,
        }
    }

    /// How many bytes are accessible.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        // ORDERING: the length only grows, and only after the bytes it adds are backed (the
        // file was extended); a thread reaches an offset in them only through a span handed
        // out after the growth (a mutex's happens-before), so a relaxed load sees it.
        self.len.load(Ordering::Relaxed)
    }

    /// How many bytes the mapping reserves.
    pub(crate) fn reserved(&self) -> usize {
        self.mapping.len()
    }

    /// Makes the first `len` bytes accessible; they must be backed by the file (or the
    /// anonymous memory) already. Fails if the mapping does not reserve that many.
    pub(crate) fn grow(&self, len: usize) -> Result<()> {
        if len > self.mapping.len() {
            return Err(Error::OutOfBounds {
                offset: 0,
                len: len as u64,
            });
        }
        // ORDERING: see `len`.
        self.len.fetch_max(len, Ordering::Relaxed);
        self.mapping.backed(len);
        Ok(())
    }

    /// Tells the mapping that the heap has handed out blocks up to `end` (see
    /// [`Mapping::in_use`]).
    pub(crate) fn in_use(&self, end: u64) {
        self.mapping
            .in_use(usize::try_from(end).unwrap_or(usize::MAX));
    }

    /// The mapping this region owns.
    pub(crate) fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// Checks that `[offset, offset + len)` lies inside the region and returns `offset` as a
    /// `usize`.
    #[inline]
    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() as u64 => {
                usize::try_from(offset).map_err(|_| out_of_bounds(offset, len))
            }
            _ => Err(out_of_bounds(offset, len)),
        }
    }

    /// The 8-byte word at `offset`, as an atomic. `offset` must be 8-aligned and in bounds.
    pub(crate) fn word(&self, offset: u64) -> Result<&AtomicU64> {
        Ok(self.word_at(self.check_words(offset, 8)?))
    }

    /// [`check`](Self::check) for `len` bytes of words: `offset` must also be 8-aligned.
    #[inline]
    fn check_words(&self, offset: u64, len: u64) -> Result<usize> {
        let at = self.check(offset, len)?;
        if at % 8 != 0 {
            return Err(Error::OutOfBounds { offset, len });
        }
        Ok(at)
    }

    /// The `count` consecutive 8-byte words from `offset`, as atomics: one bounds and
    /// alignment check for all of them. `offset` must be 8-aligned and the words in bounds.
    #[inline]
    pub(crate) fn words(&self, offset: u64, count: usize) -> Result<&[AtomicU64]> {
        let at = self.check_words(offset, (count as u64).saturating_mul(8))?;
        Ok(self.words_at(at, count))
    }

    /// The byte at the already-checked index `at`.
    fn byte(&self, at: usize) -> &AtomicU8 {
        debug_assert!(at < self.len());
        let ptr = self.base.as_ptr().wrapping_add(at);
        // SAFETY:
        // - callers pass an index inside `[0, len)` that they derived from a range checked by
        //   `check`, so `ptr` points into the live mapping owned by `self`;
        // - `AtomicU8` has alignment 1; all heap accesses are atomic (INV-MEM-2).
        unsafe { AtomicU8::from_ptr(ptr) }
    }

    /// The word at the already-checked, 8-aligned index `at`.
    fn word_at(&self, at: usize) -> &AtomicU64 {
        debug_assert!(
            at.is_multiple_of(8) && at.checked_add(8).is_some_and(|end| end <= self.len())
        );
        // INV-MEM-1: the base is page-aligned, so an 8-aligned index is an 8-aligned address.
        #[allow(clippy::cast_ptr_alignment)]
        let ptr = self.base.as_ptr().wrapping_add(at).cast::<u64>();
        // SAFETY:
        // - callers pass an 8-aligned index whose 8 bytes lie inside a range checked by
        //   `check`, so `ptr` is in bounds of the live mapping, which `self` owns and so
        //   outlives the returned reference;
        // - it is 8-aligned (INV-MEM-1);
        // - every access to heap memory is atomic (INV-MEM-2), so there is no non-atomic
        //   access to race with.
        unsafe { AtomicU64::from_ptr(ptr) }
    }

    /// The `count` words from the already-checked, 8-aligned index `at`, as a slice (what
    /// [`words`](Self::words) returns once it has checked them): also for a run of stores,
    /// whose pointer stays in a register (a store through an atomic may, as far as the
    /// compiler knows, change the region, so `word_at` loads the base again after each one).
    fn words_at(&self, at: usize, count: usize) -> &[AtomicU64] {
        debug_assert!(
            at.is_multiple_of(8)
                && count
                    .checked_mul(8)
                    .and_then(|len| at.checked_add(len))
                    .is_some_and(|end| end <= self.len())
        );
        // INV-MEM-1: the base is page-aligned, so an 8-aligned index is an 8-aligned address.
        #[allow(clippy::cast_ptr_alignment)]
        let ptr = self.base.as_ptr().wrapping_add(at).cast::<AtomicU64>();
        // SAFETY:
        // - callers pass an 8-aligned index whose `8 * count` bytes lie inside a range
        //   checked by `check`, in the live mapping, which `self` owns and so outlives the
        //   returned slice;
        // - `ptr` is 8-aligned (INV-MEM-1), the alignment of `AtomicU64`;
        // - every access to heap memory is atomic (INV-MEM-2), so the slice's atomics race
        //   with no non-atomic access.
        unsafe { std::slice::from_raw_parts(ptr, count) }
    }

    /// The 4-byte word at the already-checked, 4-aligned index `at`.
    fn u32_at(&self, at: usize) -> &AtomicU32 {
        debug_assert!(
            at.is_multiple_of(4) && at.checked_add(4).is_some_and(|end| end <= self.len())
        );
        // INV-MEM-1: the base is page-aligned, so a 4-aligned index is a 4-aligned address.
        #[allow(clippy::cast_ptr_alignment)]
        let ptr = self.base.as_ptr().wrapping_add(at).cast::<u32>();
        // SAFETY: as in `word_at`, for 4 bytes and 4-alignment, the alignment of `AtomicU32`:
        // in bounds of the live mapping `self` owns (a range checked by `check`), aligned
        // (INV-MEM-1), and every access to heap memory is atomic (INV-MEM-2).
        unsafe { AtomicU32::from_ptr(ptr) }
    }

    /// Splits the checked range `[start, start + len)` into an unaligned head, whole 8-byte
    /// words, and an unaligned tail, returned as (head length, word count).
    #[inline]
    fn split(start: usize, len: usize) -> (usize, usize) {
        let head = (8usize.wrapping_sub(start % 8) % 8).min(len);
        let words = len.wrapping_sub(head) / 8;
        (head, words)
    }

    /// Copies `buf.len()` bytes from the heap at `offset` into `buf`.
    ///
    /// ORDERING: byte and word copies are Relaxed: they only make concurrent access
    /// race-free (INV-MEM-2); what orders payload bytes with their readers is the header's
    /// Release store and Acquire load, and the epoch protocol.
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let start = self.check(offset, buf.len() as u64)?;
        // SAFETY: `start` comes from `check` for `buf.len()` bytes, and `buf` is valid for
        // writes of that many bytes, borrowed exclusively, and cannot overlap the mapping
        // (no Rust reference into the mapping exists but atomics, INV-MEM-2).
        unsafe { self.copy_out(start, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// The `len` heap bytes at `offset`, copied once into a new vector: unlike a
    /// [`read`](Self::read) into a buffer of one's own, nothing is written to the vector's
    /// memory before the copy (zeroing a 1 KiB value first cost a read of it a tenth of its
    /// time, and a small one a `calloc` instead of a `malloc`).
    #[inline]
    pub(crate) fn read_to_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let start = self.check(offset, len as u64)?;
        let mut out = Vec::with_capacity(len);
        // SAFETY: `start` comes from `check` for `len` bytes; the destination is the fresh
        // allocation of `out`, at least `len` bytes of capacity, which no one else can reach
        // and which cannot overlap the mapping.
        unsafe { self.copy_out(start, out.as_mut_ptr(), len) };
        // SAFETY: the copy above initialized the first `len` bytes, within the capacity.
        unsafe { out.set_len(len) };
        Ok(out)
    }

    /// Copies the `len` heap bytes at the checked index `start` to `dst` (see
    /// [`read`](Self::read)): one string copy for a long range, otherwise a byte head,
    /// whole words and a byte tail, each an atomic load.
    ///
    /// # Safety
    ///
    /// `[start, start + len)` was checked by [`check`](Self::check), and `dst` is valid
    /// for writes of `len` bytes and does not overlap the mapping.
    #[inline]
    unsafe fn copy_out(&self, start: usize, dst: *mut u8, len: usize) {
        #[cfg(target_arch = "x86_64")]
        if len >= STRING_COPY_MIN {
            // SAFETY: the source lies inside the live mapping (checked, this function's
            // contract), which `self` owns for the duration of the call, and is read by
            // single-byte accesses (INV-MEM-2); `dst` is valid for `len` bytes and disjoint
            // from it (this function's contract).
            unsafe {
                copy_string(
                    dst,
                    self.base.as_ptr().wrapping_add(start).cast_const(),
                    len,
                );
            }
            return;
        }
        let (head, words) = Self::split(start, len);
        let tail_at = head.wrapping_add(words.wrapping_mul(8));
        // The head and the tail each come from one load of the aligned word holding them,
        // not a load per byte: a short value after a 4-byte length prefix is all head and
        // tail.
        if head > 0 {
            let aligned = start & !7;
            let word = bytes_from(self.enclosing_word(aligned), start.wrapping_sub(aligned));
            // SAFETY: `head <= len`, so the destination lies in `dst`'s `len` bytes (this
            // function's contract); `head < 8` and `start - aligned + head <= 8` (`split`:
            // the head ends at the next 8-aligned index or at the end of the range), so
            // `word`'s first `head` bytes are the range's.
            unsafe { copy_short(dst, word, head) };
        }
        if words > 0 {
            let src = self.words_at(start.wrapping_add(head), words);
            for (i, word) in src.iter().enumerate() {
                let value = word.load(Ordering::Relaxed).to_ne_bytes();
                // SAFETY: `head + 8 * (i + 1) <= len`, inside `dst`'s `len` bytes, which the
                // caller guarantees valid and disjoint from `value`, a local copy.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        value.as_ptr(),
                        dst.wrapping_add(head.wrapping_add(i.wrapping_mul(8))),
                        8,
                    );
                }
            }
        }
        if tail_at < len {
            // `start + tail_at` is 8-aligned: the head ended at an aligned index.
            let word = self
                .enclosing_word(start.wrapping_add(tail_at))
                .to_ne_bytes();
            // SAFETY: the tail is shorter than 8 bytes (whole words went above) and ends at
            // `len`, inside `dst` (this function's contract); its source is `word`'s first
            // bytes.
            unsafe { copy_short(dst.wrapping_add(tail_at), word, len.wrapping_sub(tail_at)) };
        }
    }

    /// The 8-aligned word at the index `aligned`, loaded (Relaxed, as [`read`](Self::read)
    /// explains), where `aligned` holds an index inside the region's checked range whose
    /// word may run past the region's length: the word never crosses a page, and the
    /// mapping holds whole pages (INV-MEM-1), so it is mapped and backed wherever that byte
    /// is. The bytes past the range are loaded and ignored.
    #[inline]
    fn enclosing_word(&self, aligned: usize) -> u64 {
        debug_assert!(aligned.is_multiple_of(8) && aligned < self.len());
        #[allow(clippy::cast_ptr_alignment)]
        let ptr = self.base.as_ptr().wrapping_add(aligned).cast::<u64>();
        // SAFETY:
        // - `ptr` is 8-aligned (INV-MEM-1) and its 8 bytes lie in the page that holds the
        //   in-bounds byte at `aligned` (an aligned word never crosses a page), which the
        //   live mapping `self` owns holds and backs (`grow` makes bytes accessible only once
        //   they are backed, a page at a time for the kernel);
        // - every access to heap memory is atomic (INV-MEM-2): an atomic load races with no
        //   access, whoever owns the bytes past the range.
        unsafe { AtomicU64::from_ptr(ptr) }.load(Ordering::Relaxed)
    }

    /// Copies `src` into the heap at `offset` (Relaxed, as [`read`](Self::read) explains).
    pub(crate) fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let start = self.check(offset, src.len() as u64)?;
        self.copy_in(start, src);
        Ok(())
    }

    /// Writes a whole block at `offset`, an 8-aligned block start, with one bounds check: the
    /// header's four `body` words (Release stores), then `payload` right after the header and
    /// its trailer right after the payload, as [`write`](Self::write) copies them, and last
    /// the `meta` word (a Release store): it makes the header valid (INV-HDR-1) and
    /// publishes the whole block to a reader that sees it.
    /// The words are stored as given (the caller chose their byte order). The trailer is the
    /// crc32c of the little-endian `sum_words` followed by the payload, little-endian; a
    /// short payload is checksummed as it is copied, in one pass over it.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn write_block(
        &self,
        offset: u64,
        body: &[u64; 4],
        meta: u64,
        payload: &[u8],
        sum_words: &[u64; 2],
    ) -> Result<()> {
        let total = (HEADER as u64)
            .saturating_add(payload.len() as u64)
            .saturating_add(TRAILER as u64);
        let start = self.check_words(offset, total)?;
        self.body_in(start, body);
        // 8-aligned: a block start and the header's length both are.
        self.payload_in(start.wrapping_add(HEADER), payload, sum_words);
        // ORDERING: Release, after the body, the payload and the trailer, which it publishes:
        // a reader that sees the new meta word (an Acquire load) sees the whole block, even
        // one that read the block's previous owner a moment ago (NbQueue's losing pops).
        self.word_at(start).store(meta, Ordering::Release);
        Ok(())
    }

    /// Writes `payload` at the 8-aligned `offset` (a block's payload) and right after it its
    /// trailer, the crc32c of `sum_words` and the payload (little-endian), with one bounds
    /// check: a short payload is checksummed as it is copied, in one pass, as
    /// [`write_block`](Self::write_block) does. For a payload rewritten in place.
    pub(crate) fn write_payload(
        &self,
        offset: u64,
        payload: &[u8],
        sum_words: &[u64; 2],
    ) -> Result<()> {
        let total = (payload.len() as u64).saturating_add(TRAILER as u64);
        let start = self.check_words(offset, total)?;
        self.payload_in(start, payload, sum_words);
        Ok(())
    }

    /// Copies `payload` to the checked, 8-aligned index `start` and right after it its
    /// trailer, the crc32c of `sum_words` and the payload: computed as it is copied for a
    /// short payload, after the copy for a long one.
    #[inline]
    fn payload_in(&self, start: usize, payload: &[u8], sum_words: &[u64; 2]) {
        let sum = if payload.len() < crc::INLINE_MAX {
            // `start` is 8-aligned, so every whole word of the payload is an aligned word of
            // the heap.
            crc::words_then_bytes_copying(
                sum_words,
                payload,
                self.words_at(start, payload.len() / 8),
                |j, byte| {
                    // ORDERING: Relaxed, as every store of a payload's bytes: the operation's
                    // lock, or the meta word stored after them, publishes them.
                    self.byte(start.wrapping_add(j))
                        .store(byte, Ordering::Relaxed);
                },
            )
        } else {
            self.copy_in(start, payload);
            crc::words_then_bytes(sum_words, payload)
        };
        self.copy_in(start.wrapping_add(payload.len()), &sum.to_le_bytes());
    }

    /// Stores a block header at the 8-aligned `offset` with one bounds check: `body` into the
    /// four words after it, then `meta` into the word at it, each a Release store. The meta
    /// word goes last: it is what makes the header valid (INV-HDR-1). The words are stored
    /// as given (the caller chose their byte order).
    pub(crate) fn store_header(&self, offset: u64, body: &[u64; 4], meta: u64) -> Result<()> {
        let start = self.check_words(offset, HEADER as u64)?;
        self.header_in(start, body, meta);
        Ok(())
    }

    /// [`store_header`](Self::store_header) at the checked, 8-aligned index `start`.
    #[inline]
    fn header_in(&self, start: usize, body: &[u64; 4], meta: u64) {
        self.body_in(start, body);
        // ORDERING: Release pairs with the Acquire of `Media::load`; after the body, which it
        // publishes.
        self.word_at(start).store(meta, Ordering::Release);
    }

    /// The four body words of the header at the checked, 8-aligned index `start`, each a
    /// Release store; the caller stores the meta word after them.
    #[inline]
    fn body_in(&self, start: usize, body: &[u64; 4]) {
        for (i, &value) in body.iter().enumerate() {
            // ORDERING: Release pairs with the Acquire of `Media::load`.
            self.word_at(start.wrapping_add(8).wrapping_add(i.wrapping_mul(8)))
                .store(value, Ordering::Release);
        }
    }

    /// Copies `src` into the heap at the checked index `start` (see [`write`](Self::write)).
    #[inline]
    fn copy_in(&self, start: usize, src: &[u8]) {
        // A block's trailer, after a payload whose length is a multiple of four: one store.
        if let Ok(&four) = <&[u8; 4]>::try_from(src)
            && start.is_multiple_of(4)
        {
            // ORDERING: Relaxed, as every byte store below.
            self.u32_at(start)
                .store(u32::from_ne_bytes(four), Ordering::Relaxed);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if src.len() >= STRING_COPY_MIN {
            // SAFETY:
            // - the destination `[start, start + len)` lies inside the live mapping (the
            //   caller checked it with `check`), which `self` owns for the duration of the
            //   call, and is written only
            //   through atomics (INV-MEM-2) and this copy, itself a sequence of atomic byte
            //   stores (see `copy_string`);
            // - the source is `src`, borrowed for the call, of exactly `len` bytes.
            unsafe {
                copy_string(
                    self.base.as_ptr().wrapping_add(start),
                    src.as_ptr(),
                    src.len(),
                );
            }
            return;
        }
        let (head, words) = Self::split(start, src.len());
        let (head_src, rest) = src.split_at(head);
        let (word_src, tail_src) = rest.split_at(words.wrapping_mul(8));
        for (i, b) in head_src.iter().enumerate() {
            self.byte(start.wrapping_add(i))
                .store(*b, Ordering::Relaxed);
        }
        let words_at = start.wrapping_add(head);
        for (i, chunk) in word_src.chunks_exact(8).enumerate() {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(chunk);
            self.word_at(words_at.wrapping_add(i.wrapping_mul(8)))
                .store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
        }
        let tail_at = words_at.wrapping_add(words.wrapping_mul(8));
        for (i, b) in tail_src.iter().enumerate() {
            self.byte(tail_at.wrapping_add(i))
                .store(*b, Ordering::Relaxed);
        }
    }

    /// A pointer to the byte at `offset` for cache-line write-back instructions, which only
    /// need the address to be mapped. Never dereferenced by Rust code.
    pub(crate) fn addr(&self, offset: u64) -> Result<*const u8> {
        let at = self.check(offset, 1)?;
        Ok(self.base.as_ptr().wrapping_add(at).cast_const())
    }

    /// [`addr`](Self::addr) for a caller that will use the addresses of all of
    /// `[offset, offset + len)`: the whole range is checked once. `None` if it does not lie
    /// inside the region (a hint's caller has no use for the error).
    #[inline]
    pub(crate) fn addr_range(&self, offset: u64, len: u64) -> Option<*const u8> {
        let end = offset.checked_add(len)?;
        let at = usize::try_from(offset).ok()?;
        (end <= self.len() as u64).then(|| self.base.as_ptr().wrapping_add(at).cast_const())
    }
}

#[cfg(test)]
#[allow(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]
mod tests {
    use super::*;

    fn region(len: usize) -> Region {
        Region::new(Mapping::anonymous(len, true).unwrap())
    }

    #[test]
    fn words_must_be_aligned_and_in_bounds() {
        let r = region(4096);
        assert!(r.word(0).is_ok());
        assert!(r.word(4088).is_ok());
        assert!(matches!(r.word(4), Err(Error::OutOfBounds { .. })));
        assert!(matches!(r.word(4096), Err(Error::OutOfBounds { .. })));
        assert!(matches!(
            r.word(u64::MAX - 3),
            Err(Error::OutOfBounds { .. })
        ));
    }

    #[test]
    fn unaligned_byte_ranges_round_trip() {
        let r = region(4096);
        let data: Vec<u8> = (0..100u8).collect();
        for start in [0u64, 1, 3, 7, 8, 13, 3996] {
            r.write(start, &data).unwrap();
            let mut back = vec![0u8; data.len()];
            r.read(start, &mut back).unwrap();
            assert_eq!(back, data, "start {start}");
        }
        assert!(r.write(3997, &data).is_err());
    }

    #[test]
    fn long_ranges_round_trip_at_every_alignment() {
        // Long enough for the string copy, at starts and lengths around the word size.
        let r = region(8192);
        for len in [127usize, 128, 129, 1000, 4096] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            for start in [1u64, 7, 8, 9, 63, 64, 4000] {
                // Sentinels on both sides: the copy writes exactly its range.
                let end = start + len as u64;
                r.write(start - 1, &[0xAB]).unwrap();
                r.write(end, &[0xCD]).unwrap();
                r.write(start, &data).unwrap();
                let mut back = vec![0u8; len];
                r.read(start, &mut back).unwrap();
                assert_eq!(back, data, "start {start}, len {len}");
                let (mut before, mut after) = ([0u8; 1], [0u8; 1]);
                r.read(start - 1, &mut before).unwrap();
                r.read(end, &mut after).unwrap();
                assert_eq!(
                    (before, after),
                    ([0xAB], [0xCD]),
                    "start {start}, len {len}"
                );
            }
        }
        let data = vec![1u8; 200];
        assert!(r.write(8192 - 199, &data).is_err());
        let mut back = vec![0u8; 200];
        assert!(r.read(8192 - 199, &mut back).is_err());
        assert!(r.read_to_vec(8192 - 199, 200).is_err());
    }

    #[test]
    fn address_ranges_must_lie_inside_the_region() {
        let r = region(4096);
        let base = r.addr(0).unwrap();
        assert_eq!(r.addr_range(0, 4096), Some(base));
        assert_eq!(r.addr_range(64, 1024), Some(base.wrapping_add(64)));
        assert_eq!(r.addr_range(4096, 0), Some(base.wrapping_add(4096)));
        assert_eq!(r.addr_range(4032, 65), None);
        assert_eq!(r.addr_range(4096, 1), None);
        assert_eq!(r.addr_range(u64::MAX, 2), None);
    }

    #[test]
    fn four_byte_writes_round_trip_at_every_alignment() {
        // The one-store path (a 4-aligned start) and the byte path, with sentinels.
        let r = region(4096);
        for start in 1..=16u64 {
            r.write(start - 1, &[0xAB; 6]).unwrap();
            r.write(start, &[1, 2, 3, 4]).unwrap();
            let mut back = [0u8; 6];
            r.read(start - 1, &mut back).unwrap();
            assert_eq!(back, [0xAB, 1, 2, 3, 4, 0xAB], "start {start}");
        }
        assert!(r.write(4093, &[1, 2, 3, 4]).is_err());
    }

    #[test]
    fn a_whole_block_is_written_as_its_parts_would_be() {
        // Payload lengths around the word and the string copy's threshold, so the trailer
        // lands at every alignment; every byte after the trailer stays as it was.
        let r = region(8192);
        let body = [0x1111_2222_3333_4444u64, 5, 6, 0x7777_8888_9999_AAAA];
        let meta = 0xFEED_0000_0000_BEEFu64;
        for len in (0..=20).chain([127, 128, 129, 255, 256, 300]) {
            let payload: Vec<u8> = (0..len).map(|i| (i * 31 + len) as u8).collect();
            let sum_words = [0x0123_4567_89AB_CDEFu64, len as u64];
            let trailer = crc32c::crc32c_append(
                crc32c::crc32c(&[sum_words[0].to_le_bytes(), sum_words[1].to_le_bytes()].concat()),
                &payload,
            )
            .to_le_bytes();
            let at = 1024u64;
            let end = at + 40 + len as u64 + 4;
            r.write(at, &[0u8; 512]).unwrap();
            r.write(end, &[0x5A; 8]).unwrap();
            r.write_block(at, &body, meta, &payload, &sum_words)
                .unwrap();
            assert_eq!(
                r.word(at).unwrap().load(Ordering::Relaxed),
                meta,
                "len {len}"
            );
            for (i, &word) in body.iter().enumerate() {
                let got = r
                    .word(at + 8 + 8 * i as u64)
                    .unwrap()
                    .load(Ordering::Relaxed);
                assert_eq!(got, word, "len {len}, word {i}");
            }
            let mut back = vec![0u8; len + 4 + 8];
            r.read(at + 40, &mut back).unwrap();
            let mut expected = payload.clone();
            expected.extend_from_slice(&trailer);
            expected.extend_from_slice(&[0x5A; 8]);
            assert_eq!(back, expected, "len {len}");
        }
        // One check for the whole block: misaligned, or running past the end, is refused.
        assert!(r.write_block(1028, &body, meta, &[], &[0; 2]).is_err());
        assert!(
            r.write_block(8192 - 48, &body, meta, &[1; 5], &[0; 2])
                .is_err()
        );
    }

    #[test]
    fn reads_into_new_vectors_match_reads_into_buffers() {
        // Every length from empty to past the string copy's threshold, at every start
        // within a word.
        let r = region(4096);
        let data: Vec<u8> = (0..2048usize).map(|i| (i * 13 + 5) as u8).collect();
        r.write(0, &data).unwrap();
        for len in (0..=24).chain([127, 128, 129, 300]) {
            for start in 0..9u64 {
                let at = start as usize;
                let expected = &data[at..at + len];
                assert_eq!(
                    r.read_to_vec(start, len).unwrap(),
                    expected,
                    "{start} {len}"
                );
                let mut back = vec![0u8; len];
                r.read(start, &mut back).unwrap();
                assert_eq!(back, expected, "{start} {len}");
            }
        }
        assert!(r.read_to_vec(4090, 7).is_err());
    }

    /// A short read takes its head and tail from the aligned words around them: every byte
    /// it returns is the one at its place, none of the neighbours' (each differs), up to a
    /// region's last byte where the region's length is not a multiple of the word.
    #[test]
    fn short_reads_return_their_own_bytes_up_to_an_unaligned_end() {
        let r = Region::with_len(Mapping::anonymous(4096, true).unwrap(), 4093);
        let data: Vec<u8> = (0..4093usize).map(|i| (i * 7 + 1) as u8).collect();
        r.write(0, &data).unwrap();
        let ends = (4093 - 40)..4093;
        for start in (0..40).chain(ends) {
            for len in 0..=(4093 - start).min(40) {
                let mut back = vec![0xAA; len + 1];
                r.read(start as u64, &mut back[..len]).unwrap();
                assert_eq!(&back[..len], &data[start..start + len], "{start} {len}");
                assert_eq!(back[len], 0xAA, "{start} {len}: a byte past the read");
            }
        }
        assert!(r.read(4090, &mut [0; 4]).is_err());
    }
}
