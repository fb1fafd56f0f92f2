//! The on-media format: byte tables, offset constants, and the encoding of every persistent
//! word. All integers are little-endian. `docs/design.md` carries the same tables.
//!
//! ```text
//! Heap file
//! 0x0000  superblock            one page (see below)
//! 0x1000  structure directory   64 entries x 64 B
//! 0x2000  type registry         128 entries x 64 B (payload layouts)
//! 0x4000  span table            one u64 per span, to the data offset
//! data    spans                 SPAN_SIZE bytes each, data offset aligned to SPAN_SIZE
//!
//! Spans are numbered from the data offset on. The entries of the first
//! `(data offset - 0x4000) / 8` spans are in the table at 0x4000; a heap that grows past them
//! continues in groups of GROUP_SPANS spans whose first span holds the entries of its group
//! (entry `r` for the group's span `r`; the table span's own entry, 0, is unused).
//!
//! Superblock (immutable part covered by the checksum, then one mutable word per line)
//! 0x00  magic            [u8; 8]  "MONTAGE\0"
//! 0x08  format version   u32
//! 0x0C  checksum         u32      crc32c of bytes 0x00..0x40 with this field zero
//! 0x10  heap size        u64      the file's length
//! 0x18  creation id      u64      random, mixed into every block checksum
//! 0x20  span size        u64
//! 0x28  span count       u64
//! 0x30  span table       u64      offset of the span table
//! 0x38  data offset      u64      offset of span 0
//! 0x40  epoch word       u64      alone on its cache line
//! 0x80  clean shutdown   u64      1 after a clean close, 0 while open; alone on its line
//! 0xC0  journal id       u64      the journal beside the file (journal backend); 0 = none
//! 0x100 span count       u64      spans in the heap now (format 4): count | check << 48
//!
//! Directory entry (64 B)
//! 0x00  name             [u8; 32] NUL-padded UTF-8
//! 0x20  owner id         u64      entry index + 1
//! 0x28  reserved         [u8; 16] zero
//! 0x38  valid word       u64      DIR_TAG << 32 | crc32c(index, creation id, 0x00..0x38); 0 = empty
//!
//! Type registry entry (64 B)
//! 0x00  name hash        u64      FNV-1a of the payload type's name
//! 0x08  type id          u64      the layout fingerprint the type was registered with
//! 0x10  name             [u8; 40] NUL-padded UTF-8, truncated (for error messages)
//! 0x38  valid word       u64      REG_TAG << 32 | crc32c(index, creation id, 0x00..0x38); 0 = empty
//!
//! Span table entry (u64); 0 = free span
//! bits 63..32  extent (spans covered: 1 for a size-class span, n for a large block)
//! bits 31..24  kind (1 = size-class span, 2 = large block)
//! bits 23..16  size class index (size-class spans)
//! bits 15..0   check: low 16 bits of crc32c(span index, creation id, bits 63..16)
//!
//! Block header (40 B at the start of every block; blocks are 64-byte aligned)
//! 0x00  meta             u64      HEADER_TAG << 56 | epoch mod 2^20 << 36 | kind << 33
//!                                 | retired << 32 | crc32c(...); 0 = free
//! 0x08  epoch            u64
//! 0x10  uid              u64
//! 0x18  type id          u64
//! 0x20  owner id         u32
//! 0x24  payload length   u32
//! 0x28  payload bytes
//! then  trailer          u32      crc32c(offset, creation id, payload): the payload checksum,
//!                                 written with the payload (again at the epoch's write-back
//!                                 for a payload changed in part, in place)
//! ```
//!
//! The block checksum covers the block's own offset, the creation id, the meta word's upper
//! half and the four words after it. A header is valid only if its checksum matches, so a
//! header torn by a crash, stale bytes of a reused block, or random bytes are never read as
//! a block (INV-HDR-1). The meta word repeats the low bits of the header's epoch: it is one
//! aligned word, so a crash never tears it, and recovery uses it to tell a header a crash
//! tore (written in an epoch that never became durable) from a durable one that was damaged
//! (INV-HDR-2).

#![deny(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::error::{Error, Result};

/// The first eight bytes of every heap file.
pub(crate) const MAGIC: [u8; 8] = *b"MONTAGE\0";
/// The format this build writes.
pub(crate) const FORMAT_VERSION: u32 = 4;
/// The oldest format this build reads: version 3 heaps open, at the size they were created
/// with (they have no span count word, so they do not grow).
pub(crate) const OLDEST_READABLE_VERSION: u32 = 3;

pub(crate) const MAGIC_OFFSET: u64 = 0x00;
pub(crate) const SUPERBLOCK_HEAD_LEN: u64 = 0x40;
pub(crate) const EPOCH_OFFSET: u64 = 0x40;
pub(crate) const CLEAN_SHUTDOWN_OFFSET: u64 = 0x80;
pub(crate) const JOURNAL_ID_OFFSET: u64 = 0xC0;
/// The span count word (format 4): how many spans the heap has now, alone on its line.
pub(crate) const SPAN_COUNT_OFFSET: u64 = 0x100;
/// The tag in bits 63..48 of the span count word's check.
const SPAN_COUNT_CHECK_SHIFT: u32 = 48;

/// The size of a cache line: the unit of write-back on persistent memory.
pub const CACHE_LINE: u64 = 64;
/// The size of a page: the unit of write-back on a file.
pub const PAGE_SIZE: u64 = 4096;

pub(crate) const DIRECTORY_OFFSET: u64 = 0x1000;
/// The length of a directory or type-registry entry.
pub(crate) const ENTRY_LEN: u64 = 64;
/// Where an entry's valid word is; the bytes before it are the entry's body.
pub(crate) const ENTRY_VALID_OFFSET: u64 = 0x38;
/// How many named structures one heap holds.
pub const DIRECTORY_CAPACITY: usize = 64;
/// The longest structure name, in bytes.
pub const NAME_MAX: usize = 32;
pub(crate) const DIR_OWNER_OFFSET: u64 = 0x20;
const DIR_TAG: u64 = 0x4449_5245; // "DIRE"

pub(crate) const TYPE_REGISTRY_OFFSET: u64 = 0x2000;
/// How many payload types one heap records.
pub const REGISTRY_CAPACITY: usize = 128;
pub(crate) const REG_TYPE_ID_OFFSET: u64 = 0x08;
pub(crate) const REG_NAME_OFFSET: u64 = 0x10;
pub(crate) const REG_NAME_LEN: usize = 40;
const REG_TAG: u64 = 0x5459_5045; // "TYPE"
pub(crate) const SPAN_TABLE_OFFSET: u64 = 0x4000;

/// The size of a span, the unit the allocator carves into blocks of one size class.
pub const SPAN_SIZE: u64 = 64 << 10;
/// Past the table at `SPAN_TABLE_OFFSET`, spans come in groups of this many (512 MiB), the
/// first of which holds the group's span table entries.
pub(crate) const GROUP_SPANS: u64 = SPAN_SIZE / 8;

/// Bytes of header in front of every payload.
pub const HEADER_LEN: u64 = 40;
/// Bytes of the payload checksum (crc32c of the block offset, the creation id and the
/// payload) right after every payload.
pub const TRAILER_LEN: u64 = 4;
pub(crate) const HEADER_TAG: u64 = 0x4D; // "M"
const META_TAG_SHIFT: u32 = 56;
/// How many low bits of a header's epoch its meta word repeats.
pub(crate) const META_EPOCH_BITS: u32 = 20;
const META_EPOCH_SHIFT: u32 = 36;
const META_EPOCH_MASK: u64 = (1 << META_EPOCH_BITS) - 1;
const META_KIND_SHIFT: u32 = 33;
const META_KIND_MASK: u64 = 0b111;
/// Meta bit 32: the block has been superseded or deleted by a committed or running operation
/// and waits for reclamation. Not covered by the checksum: recovery ignores it, because a
/// retired block stays the durable version until its replacement is (INV-EP-3).
pub(crate) const META_RETIRED: u64 = 1 << 32;
/// The header word holding the uid.
pub(crate) const UID_OFFSET: u64 = 0x10;
/// The header word holding the owner id (low half) and the payload length (high half).
pub(crate) const LEN_WORD_OFFSET: u64 = 0x20;

/// Uids above this are never handed out (2^62, a hundred years of allocations at a
/// billion a second): a header that carries one is damaged, and the uid counter can never
/// wrap.
pub(crate) const UID_LIMIT: u64 = 1 << 62;

/// The smallest heap that holds a superblock, its tables and one span.
pub const MIN_HEAP_SIZE: u64 = 2 * SPAN_SIZE;
/// The largest heap this format describes (64 TiB).
pub const MAX_HEAP_SIZE: u64 = 1 << 46;

/// The immutable head of the superblock, as stored.
#[derive(Debug, Clone, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub(crate) struct SuperblockHead {
    pub(crate) magic: [u8; 8],
    pub(crate) version: U32,
    pub(crate) checksum: U32,
    pub(crate) heap_size: U64,
    pub(crate) creation_id: U64,
    pub(crate) span_size: U64,
    pub(crate) span_count: U64,
    pub(crate) span_table: U64,
    pub(crate) data_offset: U64,
}

const _: () = assert!(size_of::<SuperblockHead>() as u64 == SUPERBLOCK_HEAD_LEN);
const _: () = assert!(EPOCH_OFFSET.is_multiple_of(64) && CLEAN_SHUTDOWN_OFFSET.is_multiple_of(64));
const _: () =
    assert!(DIRECTORY_OFFSET + ENTRY_LEN * DIRECTORY_CAPACITY as u64 <= TYPE_REGISTRY_OFFSET);
const _: () = assert!(HEADER_LEN.is_multiple_of(8) && HEADER_LEN <= 64);
const _: () =
    assert!(TYPE_REGISTRY_OFFSET + ENTRY_LEN * REGISTRY_CAPACITY as u64 <= SPAN_TABLE_OFFSET);
const _: () = assert!(REG_NAME_OFFSET + REG_NAME_LEN as u64 == ENTRY_VALID_OFFSET);

impl SuperblockHead {
    fn compute_checksum(&self) -> u32 {
        let mut copy = self.clone();
        copy.checksum = U32::new(0);
        crc32c::crc32c(copy.as_bytes())
    }
}

/// Where everything is in one heap. Derived from the superblock, never trusted before
/// [`Geometry::from_superblock`] has checked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// The heap's size when it was created.
    pub(crate) heap_size: u64,
    pub(crate) creation_id: u64,
    /// The spans the heap has: at creation, those that fit in `heap_size`; once opened, what
    /// the span count word says (see [`with_span_count`](Self::with_span_count)).
    pub(crate) span_count: u64,
    pub(crate) span_table: u64,
    pub(crate) data_offset: u64,
    /// The format version: 3 heaps do not grow.
    pub(crate) version: u32,
}

impl Geometry {
    /// The geometry of a new heap of `size` bytes.
    pub(crate) fn for_new(size: u64, creation_id: u64) -> Result<Geometry> {
        Self::of_size(size, creation_id, FORMAT_VERSION)
    }

    fn of_size(size: u64, creation_id: u64, version: u32) -> Result<Geometry> {
        if size < MIN_HEAP_SIZE {
            return Err(Error::BadSize {
                size,
                why: "smaller than the minimum heap (128 KiB)",
            });
        }
        if size > MAX_HEAP_SIZE {
            return Err(Error::BadSize {
                size,
                why: "larger than the maximum heap (64 TiB)",
            });
        }
        if !size.is_multiple_of(PAGE_SIZE) {
            return Err(Error::BadSize {
                size,
                why: "not a multiple of the page size (4096)",
            });
        }
        // Upper bound on spans, then the table that many need, then what really fits.
        let max_spans = size / SPAN_SIZE;
        let table_end = SPAN_TABLE_OFFSET.saturating_add(max_spans.saturating_mul(8));
        let data_offset = table_end.div_ceil(SPAN_SIZE).saturating_mul(SPAN_SIZE);
        let span_count = size.saturating_sub(data_offset) / SPAN_SIZE;
        if span_count == 0 {
            return Err(Error::BadSize {
                size,
                why: "leaves no room for a single span",
            });
        }
        Ok(Geometry {
            heap_size: size,
            creation_id,
            span_count,
            span_table: SPAN_TABLE_OFFSET,
            data_offset,
            version,
        })
    }

    /// The superblock head that describes this geometry, checksum included.
    pub(crate) fn superblock(&self) -> SuperblockHead {
        let mut head = SuperblockHead {
            magic: MAGIC,
            version: U32::new(self.version),
            checksum: U32::new(0),
            heap_size: U64::new(self.heap_size),
            creation_id: U64::new(self.creation_id),
            span_size: U64::new(SPAN_SIZE),
            span_count: U64::new(self.span_count),
            span_table: U64::new(self.span_table),
            data_offset: U64::new(self.data_offset),
        };
        head.checksum = U32::new(head.compute_checksum());
        head
    }

    /// Validates the superblock head read from a file of `file_len` bytes. The span count
    /// is the one the heap was created with, until [`with_span_count`](Self::with_span_count)
    /// applies the span count word.
    pub(crate) fn from_superblock(bytes: &[u8], file_len: u64) -> Result<Geometry> {
        let Ok((head, _)) = SuperblockHead::read_from_prefix(bytes) else {
            return Err(Error::Truncated {
                expected: SUPERBLOCK_HEAD_LEN,
                actual: file_len,
            });
        };
        if head.magic != MAGIC {
            return Err(Error::BadMagic);
        }
        let version = head.version.get();
        if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(Error::FormatVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        if head.checksum.get() != head.compute_checksum() {
            return Err(Error::Corrupted {
                offset: MAGIC_OFFSET,
                what: "superblock checksum mismatch",
            });
        }
        let heap_size = head.heap_size.get();
        if file_len < heap_size {
            return Err(Error::Truncated {
                expected: heap_size,
                actual: file_len,
            });
        }
        let expected =
            Geometry::of_size(heap_size, head.creation_id.get(), version).map_err(|_| {
                Error::Corrupted {
                    offset: MAGIC_OFFSET,
                    what: "superblock describes an impossible heap size",
                }
            })?;
        let stored = Geometry {
            heap_size,
            creation_id: head.creation_id.get(),
            span_count: head.span_count.get(),
            span_table: head.span_table.get(),
            data_offset: head.data_offset.get(),
            version,
        };
        if stored != expected || head.span_size.get() != SPAN_SIZE {
            return Err(Error::Corrupted {
                offset: MAGIC_OFFSET,
                what: "superblock geometry does not match its heap size",
            });
        }
        Ok(stored)
    }

    /// Whether heaps of this format grow (version 3 heaps have no span count word).
    pub(crate) fn grows(&self) -> bool {
        self.version >= 4
    }

    /// This geometry with `span_count` spans, checked against what the superblock allows
    /// and what a file of `file_len` bytes holds: the span count word's value at open.
    pub(crate) fn with_span_count(&self, span_count: u64, file_len: u64) -> Result<Geometry> {
        let corrupted = |what| Error::Corrupted {
            offset: SPAN_COUNT_OFFSET,
            what,
        };
        if span_count < self.span_count || (!self.grows() && span_count != self.span_count) {
            return Err(corrupted(
                "the span count is below the heap's initial spans",
            ));
        }
        let len = self
            .len_with(span_count)
            .filter(|&len| len <= MAX_HEAP_SIZE)
            .ok_or_else(|| corrupted("the span count is larger than any heap"))?;
        if self.is_table_span(span_count.saturating_sub(1)) {
            return Err(corrupted("the span count ends on a span table"));
        }
        if file_len < len {
            return Err(Error::Truncated {
                expected: len,
                actual: file_len,
            });
        }
        Ok(Geometry {
            span_count,
            ..*self
        })
    }

    /// The file length a heap of `span_count` spans needs.
    pub(crate) fn len_with(&self, span_count: u64) -> Option<u64> {
        span_count
            .checked_mul(SPAN_SIZE)?
            .checked_add(self.data_offset)
    }

    /// The heap's length with its spans now.
    pub(crate) fn len(&self) -> u64 {
        self.len_with(self.span_count).unwrap_or(u64::MAX)
    }

    /// How many of the spans hold blocks (the others hold span tables).
    pub(crate) fn data_spans(&self) -> u64 {
        let first = self.first_table_capacity();
        let tables = self.span_count.saturating_sub(first).div_ceil(GROUP_SPANS);
        self.span_count.saturating_sub(tables)
    }

    /// How many spans have their entries in the table at `span_table`.
    fn first_table_capacity(&self) -> u64 {
        self.data_offset.saturating_sub(self.span_table) / 8
    }

    /// The end of the spans whose table entries lie in tables the heap has: the first
    /// table's capacity, or the end of the group of the heap's last span. The spans from
    /// `span_count` up to it are not the heap's, but their entries are in its tables.
    pub(crate) fn entries_end(&self) -> u64 {
        let first = self.first_table_capacity();
        match self.span_count.checked_sub(first.saturating_add(1)) {
            None => first,
            Some(past) => first.saturating_add(
                (past / GROUP_SPANS)
                    .saturating_add(1)
                    .saturating_mul(GROUP_SPANS),
            ),
        }
    }

    /// Whether span `index` holds the span table of its group, not blocks.
    #[inline]
    pub(crate) fn is_table_span(&self, index: u64) -> bool {
        index
            .checked_sub(self.first_table_capacity())
            .is_some_and(|past| past.is_multiple_of(GROUP_SPANS))
    }

    /// The heap offset where span `index` starts.
    #[inline]
    pub(crate) fn span_start(&self, index: u64) -> u64 {
        self.data_offset
            .saturating_add(index.saturating_mul(SPAN_SIZE))
    }

    /// The offset of span `index`'s table entry (for a table span, the unused entry 0 of its
    /// own table).
    pub(crate) fn span_entry_offset(&self, index: u64) -> u64 {
        let first = self.first_table_capacity();
        match index.checked_sub(first) {
            None => self.span_table.saturating_add(index.saturating_mul(8)),
            Some(past) => {
                let within = past % GROUP_SPANS;
                let table = index.saturating_sub(within);
                self.span_start(table)
                    .saturating_add(within.saturating_mul(8))
            }
        }
    }

    /// The spans the heap should have after growing from its `span_count` to make room for
    /// at least `wanted` more contiguous data spans, by steps that double its spans up to
    /// 1 GiB at a time, never past `limit` spans; `None` when no such count fits.
    pub(crate) fn grown_span_count(&self, wanted: u64, limit: u64) -> Option<u64> {
        const STEP_MAX: u64 = (1 << 30) / SPAN_SIZE;
        // A run of a group's spans or more fits only below the first group table: for one,
        // grow no further than that, and not at all if it cannot fit there (growing would
        // never make room, only take the disk).
        let limit = if wanted >= GROUP_SPANS {
            let first = self.first_table_capacity();
            if wanted > first {
                return None;
            }
            limit.min(first)
        } else {
            limit
        };
        let step = self.span_count.clamp(1, STEP_MAX).max(wanted);
        let mut target = self.span_count.checked_add(step)?.min(limit);
        // Never end on a table span (its group would have no data span).
        if target > 0 && self.is_table_span(target.saturating_sub(1)) {
            target = if target < limit {
                target.checked_add(1)?
            } else {
                target.saturating_sub(1)
            };
        }
        (target > self.span_count && target <= limit).then_some(target)
    }
}

/// The span count word for `span_count` spans.
pub(crate) fn span_count_word(span_count: u64, creation_id: u64) -> u64 {
    let count = span_count & ((1 << SPAN_COUNT_CHECK_SHIFT) - 1);
    count
        | (u64::from(checksum(&[count, creation_id, SPAN_COUNT_OFFSET], &[]) & 0xFFFF)
            << SPAN_COUNT_CHECK_SHIFT)
}

/// The span count a span count word holds, if its check matches.
pub(crate) fn decode_span_count(word: u64, creation_id: u64) -> Option<u64> {
    let count = word & ((1 << SPAN_COUNT_CHECK_SHIFT) - 1);
    (span_count_word(count, creation_id) == word).then_some(count)
}

/// What a span table entry says about a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpanEntry {
    /// Not carved.
    Free,
    /// Carved into blocks of size class `class`.
    Class(u8),
    /// The first of `extent` spans holding one large block.
    Large(u32),
}

const SPAN_KIND_CLASS: u64 = 1;
const SPAN_KIND_LARGE: u64 = 2;

/// The payload checksum stored in a block's trailer: crc32c of the block's offset, the
/// creation id and the payload's bytes, so that a payload copied to another block or heap
/// does not match either. Written with the payload, and again when the epoch is written back
/// for a payload changed in part (INV-SUM-1).
#[inline]
pub(crate) fn payload_checksum(offset: u64, creation_id: u64, payload: &[u8]) -> u32 {
    checksum(&payload_checksum_words(offset, creation_id), payload)
}

/// The words a payload checksum covers before the payload's bytes (see
/// [`payload_checksum`]), for a writer that checksums the payload as it copies it.
#[inline]
pub(crate) fn payload_checksum_words(offset: u64, creation_id: u64) -> [u64; 2] {
    [offset, creation_id]
}

/// The most payload bytes a block of `size` bytes holds: its size less the header and the
/// trailer.
pub(crate) const fn block_capacity(size: u64) -> u64 {
    size.saturating_sub(HEADER_LEN + TRAILER_LEN)
}

/// crc32c of the little-endian bytes of `words`, then of `tail`.
#[inline]
fn checksum<const N: usize>(words: &[u64; N], tail: &[u8]) -> u32 {
    super::crc::words_then_bytes(words, tail)
}

fn span_check(index: u64, creation_id: u64, upper: u64) -> u64 {
    u64::from(checksum(&[index, creation_id, upper], &[]) & 0xFFFF)
}

impl SpanEntry {
    pub(crate) fn encode(self, index: u64, creation_id: u64) -> u64 {
        let upper = match self {
            SpanEntry::Free => return 0,
            SpanEntry::Class(class) => {
                (1u64 << 32) | (SPAN_KIND_CLASS << 24) | (u64::from(class) << 16)
            }
            SpanEntry::Large(extent) => (u64::from(extent) << 32) | (SPAN_KIND_LARGE << 24),
        };
        upper | span_check(index, creation_id, upper)
    }

    pub(crate) fn decode(word: u64, index: u64, creation_id: u64) -> Option<SpanEntry> {
        if word == 0 {
            return Some(SpanEntry::Free);
        }
        let upper = word & !0xFFFF;
        if word & 0xFFFF != span_check(index, creation_id, upper) {
            return None;
        }
        let extent = (word >> 32) as u32;
        match (word >> 24) & 0xFF {
            SPAN_KIND_CLASS if extent == 1 => Some(SpanEntry::Class(((word >> 16) & 0xFF) as u8)),
            SPAN_KIND_LARGE if extent >= 1 => Some(SpanEntry::Large(extent)),
            _ => None,
        }
    }
}

/// The fields of a block header besides its validity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawHeader {
    pub(crate) kind: u8,
    pub(crate) epoch: u64,
    pub(crate) uid: u64,
    pub(crate) type_id: u64,
    pub(crate) owner: u32,
    pub(crate) len: u32,
}

impl RawHeader {
    /// The four words after `meta`, in order.
    pub(crate) fn body_words(&self) -> [u64; 4] {
        [
            self.epoch,
            self.uid,
            self.type_id,
            u64::from(self.owner) | (u64::from(self.len) << 32),
        ]
    }

    /// The meta word that makes this header valid for a block at `offset`.
    #[inline]
    pub(crate) fn meta(&self, offset: u64, creation_id: u64) -> u64 {
        let upper = (HEADER_TAG << META_TAG_SHIFT)
            | ((self.epoch & META_EPOCH_MASK) << META_EPOCH_SHIFT)
            | ((u64::from(self.kind) & META_KIND_MASK) << META_KIND_SHIFT);
        upper | u64::from(header_crc(offset, creation_id, upper, &self.body_words()))
    }

    /// Decodes a header from its five words, or `None` if it is not a valid header for a
    /// block at `offset` (free, torn, stale or garbage).
    // Always inlined: it runs on every header read, where a call cost its words a trip
    // through the stack and back.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn decode(words: [u64; 5], offset: u64, creation_id: u64) -> Option<RawHeader> {
        let [meta, epoch, uid, type_id, owner_len] = words;
        if meta_epoch_bits(meta)? != epoch & META_EPOCH_MASK {
            return None;
        }
        let upper = meta & !0xFFFF_FFFF & !META_RETIRED;
        let body = [epoch, uid, type_id, owner_len];
        if meta & 0xFFFF_FFFF != u64::from(header_crc(offset, creation_id, upper, &body)) {
            return None;
        }
        Some(RawHeader {
            kind: ((meta >> META_KIND_SHIFT) & META_KIND_MASK) as u8,
            epoch,
            uid,
            type_id,
            owner: (owner_len & 0xFFFF_FFFF) as u32,
            len: (owner_len >> 32) as u32,
        })
    }
}

/// The low [`META_EPOCH_BITS`] bits of the epoch a meta word was written with, if the word
/// has the shape of one the allocator writes (the tag, a known kind); `None` for any other
/// word, which no write of the runtime leaves at a block start.
pub(crate) fn meta_epoch_bits(meta: u64) -> Option<u64> {
    let kind = (meta >> META_KIND_SHIFT) & META_KIND_MASK;
    (meta >> META_TAG_SHIFT == HEADER_TAG && (1..=3).contains(&kind))
        .then_some((meta >> META_EPOCH_SHIFT) & META_EPOCH_MASK)
}

/// Whether `bits`, the low [`META_EPOCH_BITS`] bits of an epoch, can be those of an epoch in
/// `after + 1 ..= through`.
pub(crate) fn epoch_bits_in(bits: u64, after: u64, through: u64) -> bool {
    let Some(count) = through.checked_sub(after) else {
        return false;
    };
    if count > META_EPOCH_MASK {
        return true;
    }
    // How far past `after + 1` the first epoch with these low bits is.
    let first = after.wrapping_add(1) & META_EPOCH_MASK;
    bits.wrapping_sub(first) & META_EPOCH_MASK < count
}

#[inline]
fn header_crc(offset: u64, creation_id: u64, upper: u64, body: &[u64; 4]) -> u32 {
    let words = [
        offset,
        creation_id,
        upper,
        body[0],
        body[1],
        body[2],
        body[3],
    ];
    super::crc::append_words(0, &words)
}

/// A table of 64-byte entries (the directory, the type registry): each a 56-byte body and
/// a valid word, `tag << 32 | crc32c(index, creation id, body)`, 0 for an empty entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EntryTable {
    base: u64,
    tag: u64,
    /// How many entries the table has.
    pub(crate) capacity: usize,
}

/// The structure directory.
pub(crate) const DIRECTORY: EntryTable = EntryTable {
    base: DIRECTORY_OFFSET,
    tag: DIR_TAG,
    capacity: DIRECTORY_CAPACITY,
};

/// The type registry.
pub(crate) const REGISTRY: EntryTable = EntryTable {
    base: TYPE_REGISTRY_OFFSET,
    tag: REG_TAG,
    capacity: REGISTRY_CAPACITY,
};

impl EntryTable {
    /// The offset of entry `index`.
    pub(crate) fn offset(self, index: u64) -> u64 {
        self.base.saturating_add(index.saturating_mul(ENTRY_LEN))
    }

    /// The index of the entry at `offset` (an offset inside the table).
    pub(crate) fn index_of(self, offset: u64) -> usize {
        (offset.saturating_sub(self.base) / ENTRY_LEN) as usize
    }

    /// The valid word of entry `index` whose body is `body`.
    pub(crate) fn valid_word(self, index: u64, creation_id: u64, body: &[u8]) -> u64 {
        (self.tag << 32) | u64::from(checksum(&[index, creation_id], body))
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
    use proptest::prelude::*;

    #[test]
    fn geometry_of_minimum_heap_has_one_span() {
        let g = Geometry::for_new(MIN_HEAP_SIZE, 7).unwrap();
        assert_eq!(g.span_count, 1);
        assert_eq!(g.data_offset, SPAN_SIZE);
        assert!(Geometry::for_new(MIN_HEAP_SIZE - 4096, 7).is_err());
        assert!(Geometry::for_new(MIN_HEAP_SIZE + 1, 7).is_err());
        assert!(Geometry::for_new(MAX_HEAP_SIZE + 4096, 7).is_err());
    }

    #[test]
    fn grown_spans_have_their_entries_in_their_groups_table() {
        let g = Geometry::for_new(MIN_HEAP_SIZE, 7).unwrap();
        let first = (g.data_offset - SPAN_TABLE_OFFSET) / 8;
        assert_eq!(first, 6144);
        let g = Geometry {
            span_count: first + 3 * GROUP_SPANS + 5,
            ..g
        };
        let mut seen = std::collections::HashSet::new();
        let mut tables = 0;
        for span in 0..g.span_count {
            let entry = g.span_entry_offset(span);
            assert!(entry.is_multiple_of(8));
            if g.is_table_span(span) {
                tables += 1;
                // Its own entry is the unused first word of its table.
                assert_eq!(entry, g.span_start(span));
                continue;
            }
            assert!(seen.insert(entry), "span {span} shares its entry");
            if span < first {
                assert!(entry >= SPAN_TABLE_OFFSET && entry < g.data_offset);
            } else {
                let table = first + (span - first) / GROUP_SPANS * GROUP_SPANS;
                assert!(g.is_table_span(table));
                let start = g.span_start(table);
                assert!(entry > start && entry < start + SPAN_SIZE, "span {span}");
            }
        }
        assert_eq!(tables, 4);
        assert!(g.is_table_span(first) && g.is_table_span(first + GROUP_SPANS));
        assert!(!g.is_table_span(first - 1) && !g.is_table_span(first + 1));
        assert_eq!(g.data_spans(), g.span_count - 4);
    }

    #[test]
    fn growth_steps_double_up_to_a_gib_and_never_end_on_a_table() {
        let g = Geometry::for_new(MIN_HEAP_SIZE, 7).unwrap();
        assert_eq!(g.grown_span_count(1, 1000), Some(2));
        assert_eq!(g.grown_span_count(5, 1000), Some(6));
        assert_eq!(g.grown_span_count(1, 1), None);
        let big = Geometry {
            span_count: 100_000,
            ..g
        };
        let step = (1 << 30) / SPAN_SIZE;
        let target = big.grown_span_count(1, u64::MAX).unwrap();
        assert_eq!(
            target - big.span_count,
            step + u64::from(big.is_table_span(big.span_count + step - 1))
        );
        assert_eq!(big.grown_span_count(1, 100_010), Some(100_010));
        // A run of a group or more fits only below the first table: past it, no growth helps.
        assert_eq!(big.grown_span_count(GROUP_SPANS, u64::MAX), None);
        assert_eq!(
            big.grown_span_count(GROUP_SPANS - 1, u64::MAX),
            Some(100_000 + step)
        );
        let small = Geometry {
            span_count: 100,
            ..g
        };
        assert_eq!(small.grown_span_count(GROUP_SPANS, u64::MAX), None);
        let created_big = Geometry::for_new(4 << 30, 7).unwrap();
        let first = (created_big.data_offset - SPAN_TABLE_OFFSET) / 8;
        assert!(first > 2 * GROUP_SPANS);
        assert_eq!(
            created_big.grown_span_count(GROUP_SPANS + 5, u64::MAX),
            Some(first)
        );
        for count in 6000..6200 {
            for limit in [count + 1, count + 150, u64::MAX] {
                let g = Geometry {
                    span_count: count,
                    ..g
                };
                if let Some(target) = g.grown_span_count(3, limit) {
                    assert!(target > count && target <= limit);
                    assert!(!g.is_table_span(target - 1), "{count} -> {target}");
                }
            }
        }
    }

    #[test]
    fn the_span_count_word_round_trips_and_detects_flips() {
        let word = span_count_word(6150, 0xABCD);
        assert_eq!(decode_span_count(word, 0xABCD), Some(6150));
        assert_eq!(decode_span_count(word, 0xABCE), None);
        for bit in 0..64 {
            assert_eq!(
                decode_span_count(word ^ (1 << bit), 0xABCD),
                None,
                "bit {bit}"
            );
        }
        let g = Geometry::for_new(MIN_HEAP_SIZE, 7).unwrap();
        assert!(g.with_span_count(0, u64::MAX).is_err());
        assert!(
            g.with_span_count(6144 + 1, u64::MAX).is_err(),
            "ends on a table span"
        );
        assert!(matches!(
            g.with_span_count(10, g.len_with(10).unwrap() - 1),
            Err(Error::Truncated { .. })
        ));
        assert_eq!(
            g.with_span_count(10, u64::MAX).unwrap().len(),
            g.len_with(10).unwrap()
        );
        let v3 = Geometry { version: 3, ..g };
        assert!(!v3.grows());
        assert!(v3.with_span_count(2, u64::MAX).is_err());
    }

    #[test]
    fn epoch_bits_in_covers_wide_and_empty_windows() {
        assert!(!epoch_bits_in(5, 9, 9));
        assert!(!epoch_bits_in(5, 9, 3));
        assert!(epoch_bits_in(0, META_EPOCH_MASK, META_EPOCH_MASK + 1));
        assert!(epoch_bits_in(77, 10, 10 + META_EPOCH_MASK + 1));
        assert!(!epoch_bits_in(10, 10, 10 + META_EPOCH_MASK));
        assert!(epoch_bits_in(11, 10, 10 + META_EPOCH_MASK));
    }

    #[test]
    fn superblock_round_trips_and_detects_flips() {
        let g = Geometry::for_new(64 << 20, 0xABCD).unwrap();
        let head = g.superblock();
        let bytes = head.as_bytes().to_vec();
        assert_eq!(Geometry::from_superblock(&bytes, 64 << 20).unwrap(), g);
        for bit in 0..(SUPERBLOCK_HEAD_LEN as usize * 8) {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                Geometry::from_superblock(&flipped, 64 << 20).is_err(),
                "bit {bit}"
            );
        }
    }

    proptest! {
        #[test]
        fn geometry_fits_inside_the_heap(pages in 32u64..100_000) {
            let size = pages * 4096;
            let g = Geometry::for_new(size, 1).unwrap();
            prop_assert!(g.span_table + 8 * g.span_count <= g.data_offset);
            prop_assert!(g.data_offset + g.span_count * SPAN_SIZE <= size);
            prop_assert!(g.data_offset.is_multiple_of(SPAN_SIZE));
        }

        #[test]
        fn headers_round_trip_and_reject_any_changed_word(
            kind in 1u8..4, epoch: u64, uid: u64, type_id: u64, owner: u32, len: u32,
            which in 0usize..5, flip in 1u64..,
        ) {
            let h = RawHeader { kind, epoch, uid, type_id, owner, len };
            let body = h.body_words();
            let words = [h.meta(4096, 9), body[0], body[1], body[2], body[3]];
            prop_assert_eq!(RawHeader::decode(words, 4096, 9), Some(h));
            prop_assert_eq!(RawHeader::decode(words, 4160, 9), None);
            prop_assert_eq!(RawHeader::decode(words, 4096, 10), None);
            let mut torn = words;
            torn[which] ^= flip;
            prop_assert_eq!(RawHeader::decode(torn, 4096, 9), None);
        }

        #[test]
        fn a_meta_word_carries_its_epochs_low_bits(
            kind in 1u8..4, epoch: u64, uid: u64, owner: u32, len: u32, retired: bool,
        ) {
            let h = RawHeader { kind, epoch, uid, type_id: 5, owner, len };
            let meta = h.meta(8192, 3) | if retired { META_RETIRED } else { 0 };
            prop_assert_eq!(meta_epoch_bits(meta), Some(epoch & META_EPOCH_MASK));
            // Every single-bit change of the tag or the kind makes the word unlike any the
            // allocator writes, or names another kind.
            for bit in (META_KIND_SHIFT..META_KIND_SHIFT + 3).chain(META_TAG_SHIFT..64) {
                let changed = meta ^ (1 << bit);
                prop_assert!(
                    meta_epoch_bits(changed).is_none()
                        || (changed >> META_KIND_SHIFT) & META_KIND_MASK != u64::from(kind)
                );
            }
        }

        #[test]
        fn epoch_bits_in_agrees_with_counting(
            after in 0u64..(1 << 22), count in 0u64..5000, probe in 0u64..(1 << 22),
        ) {
            let through = after + count;
            let bits = probe & META_EPOCH_MASK;
            let counted = (after + 1..=through).any(|e| e & META_EPOCH_MASK == bits);
            prop_assert_eq!(epoch_bits_in(bits, after, through), counted);
        }

        #[test]
        fn span_entries_round_trip(class in 0u8..64, extent in 1u32..10_000, index in 0u64..1_000_000) {
            for entry in [SpanEntry::Class(class), SpanEntry::Large(extent), SpanEntry::Free] {
                let word = entry.encode(index, 3);
                prop_assert_eq!(SpanEntry::decode(word, index, 3), Some(entry));
                if entry != SpanEntry::Free {
                    prop_assert_eq!(SpanEntry::decode(word, index + 1, 3), None);
                }
            }
        }
    }
}
