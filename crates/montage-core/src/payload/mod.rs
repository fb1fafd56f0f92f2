//! Typed payloads: the [`Payload`] trait `#[derive(Payload)]` implements, the typed handles
//! [`PRef`] (a payload in the heap) and [`POff`] (a handle stored inside a payload), and the
//! field accessors the derive's generated methods call.
//!
//! A payload type is a `#[repr(C)]` struct of plain-old-data fields. Its bytes in the heap
//! are its fields' bytes at their `offset_of!` offsets; every read goes through
//! [`PayloadField::read_field`], which validates the bytes (a `bool` must be 0 or 1), so a
//! damaged heap gives [`Error::Corrupted`](crate::Error::Corrupted), never an invalid value. No reference into the
//! heap is ever formed: fields are copied out and in through the heap's atomic accessors.
//!
//! Which field types are plain old data is zerocopy's judgement, not ours: a
//! [`PayloadField`] is a type zerocopy proves plain old data (`TryFromBytes`, `IntoBytes`,
//! `Immutable`) that also has a field id of its own, [`PayloadField::LAYOUT`]: the
//! integers, floats, `bool`, `char`, arrays of field types and [`POff`] here, every
//! `#[derive(Payload)]` struct (the derive proves the struct has no padding by deriving
//! zerocopy's `IntoBytes` for a layout twin of it, whose fields are the struct's fields'
//! `PayloadField::Repr` types), and a user's own zerocopy types through
//! [`payload_field!`](crate::payload_field). A payload's type id is built from its fields'
//! ids, names and offsets, so it follows the resolved layout: a type alias spells a field
//! differently but gives it the same id.

pub(crate) mod access;
pub(crate) mod codec;
#[cfg(feature = "serde")]
pub(crate) mod serde_codec;
// A slice of bytes found behind a generic iterator, copied whole (the file says why).
#[cfg(feature = "serde")]
#[allow(unsafe_code)]
mod serde_write;

pub use crate::fingerprint::Fingerprint;
pub use codec::{Codec, EncodeAs, Encoded};
#[cfg(feature = "serde")]
pub use serde_codec::{Serde, encode_serde};

use std::marker::PhantomData;

use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, TryFromBytes};

use crate::alloc::block::PBlock;
use crate::epoch::op::OpGuard;
use crate::error::Result;

/// A value that can be stored in a payload field.
///
/// Implemented for the integers, floats, `bool`, `char`, arrays of field types and [`POff`];
/// by `#[derive(Payload)]` for every payload struct, so payloads nest; and by
/// [`payload_field!`](crate::payload_field) for a user's own zerocopy-derived types
/// (`#[repr(u8)]` enums, padding-free `#[repr(C)]` structs).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored in a payload field",
    label = "not plain old data",
    note = "payload fields hold plain old data: integers, floats, `bool`, `char`, arrays of them, `POff<T>`, other `#[derive(Payload)]` structs, or types deriving zerocopy's `TryFromBytes`, `IntoBytes` and `Immutable` and declared with `montage::payload_field!`",
    note = "pointers, references and owning types (`Box`, `Vec`, `String`, `Rc`, `Arc`) point into DRAM, which does not survive a restart; an enum needs a fixed `#[repr(u8)]` (or other integer) representation"
)]
pub trait PayloadField: Sized + Send + Sync + 'static {
    /// A type with the same layout whose zerocopy derives prove that layout has no padding
    /// (`Self` for zerocopy types; a generated twin for payload structs).
    type Repr;
    /// A fingerprint of the stored representation, mixed into the type ids of the payloads
    /// that contain this field.
    const LAYOUT: u64;

    /// Writes the field's bytes into `out`.
    ///
    /// # Panics
    ///
    /// If `out.len() != size_of::<Self>()`.
    fn write_field(&self, out: &mut [u8]);

    /// Reads a value from its stored bytes; `None` if they are not a valid value or
    /// `bytes.len() != size_of::<Self>()`.
    fn read_field(bytes: &[u8]) -> Option<Self>;
}

/// Implements [`PayloadField`] for a plain-old-data type of the caller's: a type that derives
/// zerocopy's `TryFromBytes`, `IntoBytes` and `Immutable` (a `#[repr(u8)]` enum, or a
/// `#[repr(C)]` struct without padding), so that payloads can hold it as a field.
///
/// The type's field id is built from the name written here, its size and its alignment:
/// write the type's own name, at its definition. Renaming the type, or changing its size or
/// alignment, changes the id of every payload that holds it (and the heap then reports
/// [`Error::LayoutMismatch`](crate::Error::LayoutMismatch) for them); changing its variants
/// or fields without changing its size does not, so give a changed type a new name.
///
/// ```
/// use montage_core::payload::PayloadField;
/// use montage_core::payload_field;
/// use zerocopy::{Immutable, IntoBytes, TryFromBytes};
///
/// #[derive(Clone, Copy, TryFromBytes, IntoBytes, Immutable)]
/// #[repr(u8)]
/// enum Colour {
///     Red = 1,
///     Blue = 2,
/// }
/// payload_field!(Colour);
///
/// // A payload holding a `Colour` stores its one byte, and reading a byte that is no
/// // `Colour` fails (the heap reports it as corrupted) instead of giving a bad value.
/// let mut byte = [0u8];
/// for (colour, stored) in [(Colour::Red, 1), (Colour::Blue, 2)] {
///     colour.write_field(&mut byte);
///     assert_eq!(byte, [stored]);
///     assert!(Colour::read_field(&byte).is_some());
/// }
/// assert!(Colour::read_field(&[3]).is_none());
/// ```
#[macro_export]
macro_rules! payload_field {
    ($($ty:ident),+ $(,)?) => {$(
        impl $crate::payload::PayloadField for $ty {
            type Repr = $ty;
            const LAYOUT: u64 = $crate::payload::Fingerprint::new()
                .str(::core::stringify!($ty))
                .u64(::core::mem::size_of::<$ty>() as u64)
                .u64(::core::mem::align_of::<$ty>() as u64)
                .finish();

            fn write_field(&self, out: &mut [u8]) {
                $crate::__private::write_plain(self, out);
            }

            fn read_field(bytes: &[u8]) -> ::core::option::Option<Self> {
                $crate::__private::read_plain(bytes)
            }
        }
    )+};
}

payload_field!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64, bool, char
);

/// An array of field types is a field type; its id is its element's id and its length.
impl<T, const N: usize> PayloadField for [T; N]
where
    T: PayloadField + TryFromBytes + IntoBytes + Immutable,
{
    type Repr = [T; N];
    const LAYOUT: u64 = Fingerprint::new()
        .str("array")
        .u64(T::LAYOUT)
        .u64(N as u64)
        .finish();

    fn write_field(&self, out: &mut [u8]) {
        access::write_plain(self, out);
    }

    fn read_field(bytes: &[u8]) -> Option<Self> {
        access::read_plain(bytes)
    }
}

/// A handle is a field type; its id does not depend on the target type (a payload may hold
/// a handle to its own type, whose id cannot depend on itself).
impl<T: ?Sized + 'static> PayloadField for POff<T> {
    type Repr = POff<T>;
    const LAYOUT: u64 = Fingerprint::new()
        .str("POff")
        .u64(size_of::<POff<T>>() as u64)
        .finish();

    fn write_field(&self, out: &mut [u8]) {
        access::write_plain(self, out);
    }

    fn read_field(bytes: &[u8]) -> Option<Self> {
        access::read_plain(bytes)
    }
}

/// A type whose values live in the persistent heap as payloads. Implement it with
/// `#[derive(Payload)]`, which checks the layout and generates the accessors.
///
/// The type id is a fingerprint of the type's name and of each field's name, offset and
/// field id ([`PayloadField::LAYOUT`], which follows the field's resolved type, not its
/// spelling): it is the same in every build of the same definition and changes when the
/// layout does. The heap records it under the type's name the first time the type is
/// stored, and reports [`Error::LayoutMismatch`](crate::Error::LayoutMismatch) when a
/// program later uses a different layout under the same name.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a payload type",
    label = "needs `#[derive(Payload)]`",
    note = "add `#[derive(Payload)]` and `#[repr(C)]` to the struct's definition"
)]
pub trait Payload: PayloadField {
    /// The name the heap's type registry knows this type by.
    const TYPE_NAME: &'static str;
    /// The layout fingerprint stored in every block of this type.
    const TYPE_ID: u64;
}

/// A handle to a payload of type `T` in a heap (the payload's current version).
///
/// Obtained from [`OpGuard::alloc_payload`] or a recovery scan. Accessors take the
/// operation they run in; an update across an epoch boundary moves the payload to a new
/// block (copy-on-write) and returns the handle to use from then on. A handle names one
/// version of a payload: after a copy-on-write the old handle fails with
/// [`Error::Retired`](crate::Error::Retired) or [`Error::InvalidBlock`](crate::Error::InvalidBlock)
/// (or, once the block is reused, reads another payload of the same type), so structures
/// keep the newest handle in their index.
pub struct PRef<T> {
    block: PBlock,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for PRef<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for PRef<T> {}
impl<T> PartialEq for PRef<T> {
    fn eq(&self, other: &Self) -> bool {
        self.block == other.block
    }
}
impl<T> Eq for PRef<T> {}
impl<T> std::hash::Hash for PRef<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.block.hash(state);
    }
}
impl<T> std::fmt::Debug for PRef<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PRef({:#x})", self.block.offset())
    }
}

impl<T: Payload> PRef<T> {
    pub(crate) fn from_block(block: PBlock) -> PRef<T> {
        PRef {
            block,
            _type: PhantomData,
        }
    }

    /// The block holding this version of the payload.
    pub fn block(self) -> PBlock {
        self.block
    }

    /// A handle to store inside another payload.
    pub fn to_poff(self) -> POff<T> {
        POff {
            raw: U64::new(self.block.offset()),
            _type: PhantomData,
        }
    }

    /// The whole payload.
    ///
    /// # Errors
    ///
    /// [`Error::Aborted`](crate::Error::Aborted) if the payload is newer than `op`;
    /// [`Error::WrongType`](crate::Error::WrongType) or
    /// [`Error::InvalidBlock`](crate::Error::InvalidBlock) for a handle that does not name a
    /// live `T`; [`Error::Corrupted`](crate::Error::Corrupted) if the bytes are not a valid `T`.
    pub fn get(self, op: &OpGuard<'_>) -> Result<T> {
        access::get::<T>(op, self.block)
    }

    /// Replaces the whole payload: in place if it was written in `op`'s epoch, else by
    /// copy-on-write. Returns the handle to use from now on.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get); [`Error::Retired`](crate::Error::Retired) if another
    /// operation already replaced or deleted this version;
    /// [`Error::OutOfSpace`](crate::Error::OutOfSpace).
    pub fn set(self, op: &OpGuard<'_>, value: &T) -> Result<PRef<T>> {
        access::set_field::<T, T>(op, self, 0, value)
    }

    /// Deletes the payload (an anti-block records the deletion unless it was created in
    /// `op`'s epoch).
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set).
    pub fn delete(self, op: &OpGuard<'_>) -> Result<()> {
        let info = access::checked_info::<T>(op, self.block)?;
        op.delete(info.block)
    }
}

/// A typed handle stored inside a payload: the heap offset of a payload of type `T`, or
/// null. Eight little-endian bytes, so it is itself a [`PayloadField`].
///
/// It names one version of the target (see [`PRef`]); structures that link payloads update
/// the link when the target is copied.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(transparent)]
pub struct POff<T: ?Sized> {
    raw: U64,
    _type: PhantomData<fn() -> T>,
}

impl<T: ?Sized> POff<T> {
    /// The null handle.
    pub const NULL: POff<T> = POff {
        raw: U64::ZERO,
        _type: PhantomData,
    };

    /// A handle holding a raw heap offset (0 for null). Accesses through it check that a
    /// live payload of type `T` is there.
    pub fn from_offset(offset: u64) -> POff<T> {
        POff {
            raw: U64::new(offset),
            _type: PhantomData,
        }
    }

    /// Whether this is the null handle.
    pub fn is_null(self) -> bool {
        self.raw.get() == 0
    }

    /// The heap offset it holds (0 for null).
    pub fn offset(self) -> u64 {
        self.raw.get()
    }
}

impl<T: Payload> POff<T> {
    /// The handle it stores, `None` if null. Accesses through it check the block's type.
    pub fn to_pref(self) -> Option<PRef<T>> {
        (!self.is_null()).then(|| PRef::from_block(PBlock(self.raw.get())))
    }
}

impl<T: ?Sized> Clone for POff<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: ?Sized> Copy for POff<T> {}
impl<T: ?Sized> PartialEq for POff<T> {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}
impl<T: ?Sized> Eq for POff<T> {}
impl<T: ?Sized> Default for POff<T> {
    fn default() -> Self {
        POff::NULL
    }
}
impl<T: ?Sized> std::fmt::Debug for POff<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "POff({:#x})", self.raw.get())
    }
}

/// A payload field that `cas_<field>` can swap: an 8-byte integer word.
#[diagnostic::on_unimplemented(
    message = "`#[payload(atomic)]` field of type `{Self}` cannot be swapped atomically",
    note = "atomic payload fields are `u64` or `i64`"
)]
pub trait CasField: PayloadField + Copy + Eq + cas_field::Sealed {
    /// The word as the heap's little-endian word accessors see it.
    #[doc(hidden)]
    fn to_word(self) -> u64;
    /// The inverse of `to_word`.
    #[doc(hidden)]
    fn from_word(word: u64) -> Self;
}

mod cas_field {
    pub trait Sealed {}
    impl Sealed for u64 {}
    impl Sealed for i64 {}
}

impl CasField for u64 {
    fn to_word(self) -> u64 {
        // Stored in native byte order (`write_field`); the word accessors read little-endian.
        u64::from_le_bytes(self.to_ne_bytes())
    }
    fn from_word(word: u64) -> Self {
        u64::from_ne_bytes(word.to_le_bytes())
    }
}

impl CasField for i64 {
    fn to_word(self) -> u64 {
        u64::from_le_bytes(self.to_ne_bytes())
    }
    fn from_word(word: u64) -> Self {
        i64::from_ne_bytes(word.to_le_bytes())
    }
}
