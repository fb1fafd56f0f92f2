//! The public vocabulary of blocks: handles (`PBlock`), owners, kinds, and what a header says.

use crate::base::epoch::Epoch;
use crate::base::layout::{HEADER_LEN, RawHeader, TRAILER_LEN};
use crate::error::{Error, Result};
use crate::persist::Media;

/// A handle to one block in a heap: the byte offset of its header. Offsets, never addresses,
/// so a handle stays valid when the heap is mapped elsewhere, and can itself be stored in
/// the heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PBlock(pub(crate) u64);

impl PBlock {
    /// A handle for the block at heap offset `offset` (as stored, for example, in a DRAM
    /// index word). Nothing is checked here; every access through the handle checks that a
    /// live block is there.
    pub fn from_offset(offset: u64) -> PBlock {
        PBlock(offset)
    }

    /// The heap offset of the block's header.
    pub fn offset(self) -> u64 {
        self.0
    }

    /// The heap offset of the block's first payload byte.
    pub fn payload_offset(self) -> u64 {
        self.0 + HEADER_LEN
    }
}

/// The id a named structure's blocks carry (see [`Heap::register`](crate::Heap::register)).
/// `OwnerId::NONE` (0) marks blocks that belong to no named structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(pub(crate) u32);

impl OwnerId {
    /// Blocks that belong to no named structure.
    pub const NONE: OwnerId = OwnerId(0);

    /// The raw id as stored in block headers.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// What a block records, in the epoch protocol's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BlockKind {
    /// The first version of a payload.
    Alloc = 1,
    /// A newer version of a payload (same uid as an older block).
    Update = 2,
    /// An anti-block: the payload with this uid is deleted.
    Delete = 3,
}

impl BlockKind {
    pub(crate) fn from_raw(raw: u8) -> Option<BlockKind> {
        match raw {
            1 => Some(BlockKind::Alloc),
            2 => Some(BlockKind::Update),
            3 => Some(BlockKind::Delete),
            _ => None,
        }
    }
}

/// The header fields a new block is allocated with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockSpec {
    /// Alloc, update or anti-block.
    pub kind: BlockKind,
    /// The epoch the block was written in.
    pub epoch: Epoch,
    /// The logical payload id every version of one payload shares.
    pub uid: u64,
    /// The payload's type id (0 for untyped bytes).
    pub type_id: u64,
    /// The named structure the block belongs to.
    pub owner: OwnerId,
}

impl BlockSpec {
    /// A spec for a first version of payload `uid` in `epoch`, untyped and unowned.
    pub fn new(epoch: Epoch, uid: u64) -> BlockSpec {
        BlockSpec {
            kind: BlockKind::Alloc,
            epoch,
            uid,
            type_id: 0,
            owner: OwnerId::NONE,
        }
    }

    /// The same spec with another kind.
    #[must_use]
    pub fn kind(mut self, kind: BlockKind) -> BlockSpec {
        self.kind = kind;
        self
    }

    /// The same spec with another type id.
    #[must_use]
    pub fn type_id(mut self, type_id: u64) -> BlockSpec {
        self.type_id = type_id;
        self
    }

    /// The same spec with another owner.
    #[must_use]
    pub fn owner(mut self, owner: OwnerId) -> BlockSpec {
        self.owner = owner;
        self
    }

    #[inline]
    pub(crate) fn raw(self, len: u32) -> RawHeader {
        RawHeader {
            kind: self.kind as u8,
            epoch: self.epoch.get(),
            uid: self.uid,
            type_id: self.type_id,
            owner: self.owner.0,
            len,
        }
    }
}

/// What a valid block header says, with where the block is and how much it can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockInfo {
    /// The block.
    pub block: PBlock,
    /// Its header fields.
    pub spec: BlockSpec,
    /// The payload length in bytes.
    pub len: u32,
    /// The most payload bytes the block can hold.
    pub capacity: u64,
}

impl BlockInfo {
    pub(crate) fn from_raw(block: PBlock, raw: RawHeader, capacity: u64) -> Option<BlockInfo> {
        let kind = BlockKind::from_raw(raw.kind)?;
        if u64::from(raw.len) > capacity {
            return None;
        }
        Some(BlockInfo {
            block,
            spec: BlockSpec {
                kind,
                epoch: Epoch::new(raw.epoch),
                uid: raw.uid,
                type_id: raw.type_id,
                owner: OwnerId(raw.owner),
            },
            len: raw.len,
            capacity,
        })
    }
}

/// A valid block: its header, and read access to its payload. A scan shows each block it
/// meets as one; `Heap::view` and `OpGuard::view` give one for a block in hand.
#[derive(Debug, Clone, Copy)]
pub struct BlockView<'a> {
    info: BlockInfo,
    media: &'a Media,
    /// The meta word the header was read with.
    meta: u64,
    /// Whether an operation took this view (its writes may then trust `meta`).
    by_op: bool,
}

impl<'a> BlockView<'a> {
    /// The view of the block `info` describes, whose header the caller read, with the meta
    /// word `meta`, and validated.
    pub(crate) fn new(info: BlockInfo, media: &'a Media, meta: u64) -> BlockView<'a> {
        BlockView {
            info,
            media,
            meta,
            by_op: false,
        }
    }

    /// This view, taken by an operation.
    pub(crate) fn taken_by_op(self) -> BlockView<'a> {
        BlockView {
            by_op: true,
            ..self
        }
    }

    /// The meta word the header was read with, if an operation took this view of a block of
    /// `media`'s heap.
    pub(crate) fn meta_of(&self, media: &Media) -> Option<u64> {
        (self.by_op && std::ptr::eq(self.media, media)).then_some(self.meta)
    }

    /// The meta word the header was read with, however the view was taken.
    pub(crate) fn header_meta(&self) -> u64 {
        self.meta
    }

    /// The block's header.
    pub fn info(&self) -> &BlockInfo {
        &self.info
    }

    /// Copies payload bytes starting at `at` into `buf`.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfBounds`] if the range does not lie inside the payload.
    #[inline]
    pub fn read(&self, at: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        if at
            .checked_add(len)
            .is_none_or(|end| end > u64::from(self.info.len))
        {
            return Err(Error::OutOfBounds { offset: at, len });
        }
        self.media.read(self.info.block.payload_offset() + at, buf)
    }

    /// The payload's first four bytes as a little-endian `u32` (a length prefix, usually),
    /// as [`read`](Self::read) of them would give, with one word load: a payload starts
    /// 8-aligned (the layout asserts that the header's length is a multiple of 8) and the
    /// block's trailer follows it, so when the payload and trailer hold eight bytes the
    /// payload's first word lies inside the block.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfBounds`] if the payload is shorter than four bytes.
    #[inline]
    pub fn read_u32_first(&self) -> Result<u32> {
        let len = u64::from(self.info.len);
        if len >= 4 && len + TRAILER_LEN >= 8 {
            // The word's low half is its first four bytes: words are stored little-endian.
            let word = self.media.load(self.info.block.payload_offset())?;
            return Ok(word as u32);
        }
        let mut bytes = [0u8; 4];
        self.read(0, &mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    /// `len` bytes of the payload from byte `at`, copied once into a new vector.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfBounds`] if the range does not lie inside the payload.
    #[inline]
    pub fn read_to_vec(&self, at: u64, len: usize) -> Result<Vec<u8>> {
        if at
            .checked_add(len as u64)
            .is_none_or(|end| end > u64::from(self.info.len))
        {
            return Err(Error::OutOfBounds {
                offset: at,
                len: len as u64,
            });
        }
        self.media
            .read_to_vec(self.info.block.payload_offset() + at, len)
    }

    /// The whole payload.
    ///
    /// # Errors
    ///
    /// Only if the heap cannot be read, which a validated heap never causes.
    pub fn bytes(&self) -> Result<Vec<u8>> {
        self.read_to_vec(0, self.info.len as usize)
    }
}
