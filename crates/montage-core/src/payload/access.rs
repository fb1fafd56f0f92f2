//! Typed access to payloads: what [`PRef`]'s methods and the derive's accessors do, in terms
//! of the untyped operation API. Fields are copied between the heap and values through
//! [`PayloadField`], never through references into the heap.

use crate::alloc::block::{BlockInfo, OwnerId, PBlock};
use crate::epoch::op::OpGuard;
use crate::error::{Error, Result};
use crate::heap::Heap;
use crate::payload::{CasField, PRef, Payload, PayloadField};
use crate::verified::atomic::{CasError, CasErrorKind};

/// Payload bytes up to this size are staged on the stack.
const STACK_BYTES: usize = 256;

/// Runs `f` on a zeroed scratch buffer of `len` bytes.
fn with_buf<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    if len <= STACK_BYTES {
        let mut buf = [0u8; STACK_BYTES];
        f(&mut buf[..len])
    } else {
        f(&mut vec![0u8; len])
    }
}

/// `block`'s header, checked against `op`'s epoch and against `T`.
pub(crate) fn checked_info<T: Payload>(op: &OpGuard<'_>, block: PBlock) -> Result<BlockInfo> {
    let info = op.info_for_read(block)?;
    if info.spec.type_id != T::TYPE_ID {
        return Err(Error::WrongType {
            offset: block.offset(),
            expected: T::TYPE_NAME,
        });
    }
    if u64::from(info.len) != size_of::<T>() as u64 {
        return Err(Error::Corrupted {
            offset: block.offset(),
            what: "payload length differs from its type's size",
        });
    }
    Ok(info)
}

/// Reads the `F` at byte `offset` of the payload in `info`'s block.
fn read_at<F: PayloadField>(op: &OpGuard<'_>, info: &BlockInfo, offset: usize) -> Result<F> {
    let at = info.block.payload_offset() + offset as u64;
    with_buf(size_of::<F>(), |buf| {
        op.runtime().media.read(at, buf)?;
        F::read_field(buf).ok_or(Error::Corrupted {
            offset: at,
            what: "stored bytes are not a valid value of the field's type",
        })
    })
}

/// [`checked_info`], and the payload checked against its checksum where the heap verifies
/// reads ([`HeapConfig::verify_reads`](crate::HeapConfig::verify_reads)).
fn verified_info<T: Payload>(op: &OpGuard<'_>, block: PBlock) -> Result<BlockInfo> {
    let info = checked_info::<T>(op, block)?;
    op.runtime()
        .verify_payload(&info, || op.epoch().durable_cut())?;
    Ok(info)
}

/// The whole payload at `block`.
pub(crate) fn get<T: Payload>(op: &OpGuard<'_>, block: PBlock) -> Result<T> {
    let info = verified_info::<T>(op, block)?;
    read_at::<T>(op, &info, 0)
}

/// The field of type `F` at byte `offset` of the `T` at `handle` (the derive's `get_`).
///
/// # Errors
///
/// As [`PRef::get`].
pub fn get_field<T: Payload, F: PayloadField>(
    op: &OpGuard<'_>,
    handle: PRef<T>,
    offset: usize,
) -> Result<F> {
    check_field::<T, F>(offset);
    let info = verified_info::<T>(op, handle.block())?;
    read_at::<F>(op, &info, offset)
}

/// Writes `value` as the field at byte `offset` of the `T` at `block` (the derive's `set_`):
/// in place within the payload's epoch, by copy-on-write across epochs.
///
/// # Errors
///
/// As [`PRef::set`].
pub fn set_field<T: Payload, F: PayloadField>(
    op: &OpGuard<'_>,
    handle: PRef<T>,
    offset: usize,
    value: &F,
) -> Result<PRef<T>> {
    check_field::<T, F>(offset);
    let info = checked_info::<T>(op, handle.block())?;
    with_buf(size_of::<F>(), |buf| {
        value.write_field(buf);
        op.write_checked(&info, offset as u64, buf)
    })
    .map(PRef::from_block)
}

/// Swaps the 8-byte field at byte `offset` of the `T` at `handle` from `current` to `new`
/// (the derive's `cas_`), only if the payload was written in `op`'s epoch and the clock
/// still reads that epoch (INV-EP-4).
///
/// # Errors
///
/// The outer error as [`PRef::get`]; the inner [`CasError`] when the swap did not happen.
pub fn cas_field<T: Payload, F: CasField>(
    op: &OpGuard<'_>,
    handle: PRef<T>,
    offset: usize,
    current: F,
    new: F,
) -> Result<Result<(), CasError<F>>> {
    check_field::<T, F>(offset);
    let info = checked_info::<T>(op, handle.block())?;
    let fail = |kind| -> Result<Result<(), CasError<F>>> {
        Ok(Err(CasError {
            current: read_at::<F>(op, &info, offset)?,
            kind,
        }))
    };
    if info.spec.epoch != op.epoch() {
        return fail(CasErrorKind::OlderEpoch);
    }
    let at = info.block.payload_offset() + offset as u64;
    let media = &op.runtime().media;
    let Some(swap) = op.verified(|| media.compare_exchange(at, current.to_word(), new.to_word()))
    else {
        return fail(CasErrorKind::EpochAdvanced);
    };
    match swap? {
        Ok(_) => {
            // The block was written in this epoch: logged for its reseal, which writes it
            // back whole with its new checksum, as every write in place is.
            op.record_write(info.block, at, 8);
            Ok(Ok(()))
        }
        Err(found) => Ok(Err(CasError {
            current: F::from_word(found),
            kind: CasErrorKind::Mismatch,
        })),
    }
}

/// The accessors are generated with offsets from `offset_of!`; this catches a hand-written
/// call that would read outside the payload.
fn check_field<T: Payload, F: PayloadField>(offset: usize) {
    assert!(
        offset
            .checked_add(size_of::<F>())
            .is_some_and(|end| end <= size_of::<T>()),
        "field at offset {offset} of {} bytes lies outside `{}`",
        size_of::<F>(),
        T::TYPE_NAME,
    );
}

impl OpGuard<'_> {
    /// Allocates a payload holding `value`, owned by the structure `owner`. The first
    /// payload of a type records the type's layout in the heap's registry.
    ///
    /// # Errors
    ///
    /// [`Error::LayoutMismatch`] if the heap holds `T::TYPE_NAME` with another layout;
    /// [`Error::RegistryFull`]; [`Error::OutOfSpace`].
    pub fn alloc_payload<T: Payload>(&self, owner: OwnerId, value: &T) -> Result<PRef<T>> {
        self.ensure_type(T::TYPE_NAME, T::TYPE_ID)?;
        with_buf(size_of::<T>(), |buf| {
            value.write_field(buf);
            self.alloc(owner, T::TYPE_ID, buf)
        })
        .map(PRef::from_block)
    }
}

impl Heap {
    /// Checks `T` against this heap's type registry, recording it if the heap has never
    /// stored one. Structures call it when they open, before they read their payloads.
    ///
    /// # Errors
    ///
    /// [`Error::LayoutMismatch`] if the heap holds payloads of a type named
    /// `T::TYPE_NAME` with a different layout; [`Error::RegistryFull`]; a media error.
    pub fn register_type<T: Payload>(&self) -> Result<()> {
        self.shared().runtime.check_type(T::TYPE_NAME, T::TYPE_ID)
    }

    /// Every payload of type `T` owned by `owner`, with its value, scanned in parallel on
    /// `threads` threads: what a structure rebuilds its DRAM index from when it opens.
    /// Checks `T`'s layout first.
    ///
    /// Right after [`open`](Self::open) these are exactly the recovered payloads, one
    /// version each. While operations run, versions being replaced or deleted are listed
    /// too; a structure scans before it serves operations.
    ///
    /// # Errors
    ///
    /// As [`register_type`](Self::register_type); [`Error::Corrupted`] if a stored payload is
    /// not a valid `T`.
    pub fn payloads<T: Payload>(
        &self,
        owner: OwnerId,
        threads: usize,
    ) -> Result<Vec<(PRef<T>, T)>> {
        self.register_type::<T>()?;
        let found = std::sync::Mutex::new(Vec::new());
        let filter = crate::heap::ScanFilter::all()
            .live()
            .owner(owner)
            .type_id(T::TYPE_ID);
        self.scan_payloads(filter, threads, |info, bytes| {
            if bytes.len() != size_of::<T>() {
                return Err(Error::Corrupted {
                    offset: info.block.offset(),
                    what: "payload length differs from its type's size",
                });
            }
            let value = T::read_field(bytes).ok_or(Error::Corrupted {
                offset: info.block.offset(),
                what: "stored bytes are not a valid value of the payload's type",
            })?;
            found
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((PRef::from_block(info.block), value));
            Ok(())
        })?;
        Ok(found
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// Copies a plain-old-data value's bytes into `out` (what `PayloadField::write_field` does
/// for the types zerocopy proves plain old data).
///
/// # Panics
///
/// If `out.len() != size_of::<T>()`.
pub fn write_plain<T: zerocopy::IntoBytes + zerocopy::Immutable>(value: &T, out: &mut [u8]) {
    out.copy_from_slice(value.as_bytes());
}

/// A plain-old-data value from its bytes; `None` if they are not a valid `T`.
pub fn read_plain<T: zerocopy::TryFromBytes>(bytes: &[u8]) -> Option<T> {
    T::try_read_from_bytes(bytes).ok()
}
