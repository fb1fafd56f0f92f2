//! The runtime of Montage for Rust: a persistent heap of payload blocks, the persistence
//! backends that write it back, and the recovery scan that rebuilds it after a crash.
//!
//! # What lives where
//!
//! Montage keeps only *payloads* (the abstract state of a data structure: a key and its value,
//! a queue element) in persistent memory; every index stays in DRAM and is rebuilt after a
//! restart. This crate provides the persistent half:
//!
//! * a [`Heap`]: one file, mapped shared, addressed by offsets ([`PBlock`]) so it can map
//!   anywhere; a versioned superblock with the persistent epoch word and a directory of named
//!   structures; an exclusive file lock;
//! * a payload allocator: size classes carved from 64 KiB spans whose class is persistent,
//!   per-thread free lists in DRAM, large blocks of whole spans, and a block header whose
//!   validity is one checksummed 8-byte word;
//! * persistence backends, chosen at open by [`BackendKind`]: real persistent memory
//!   (`clwb`/`clflushopt`/`clflush` + `sfence`), eADR, `msync` of an ordinary file, no-op
//!   (for measuring), and the power-failure [`Simulator`] that every crash test runs on;
//! * recovery: a parallel scan of every valid block, a caller-supplied keep/drop decision,
//!   durable invalidation of what is dropped, and free lists rebuilt from the rest.
//!
//! The epoch clock, operations and `sync()` that turn this heap into buffered durably
//! linearizable structures build on these pieces.
//!
//! # Example
//!
//! ```
//! use montage_core::{Heap, HeapConfig, ScanFilter, SimMode};
//!
//! // A heap on the power-failure simulator (its clock moves only when asked).
//! let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
//! let heap = Heap::create(&config)?;
//! let owner = heap.register("greetings")?;
//! heap.run_op(|op| op.alloc(owner, 0, b"acknowledged"))?;
//! heap.sync()?; // everything completed so far is durable now
//! heap.run_op(|op| op.alloc(owner, 0, b"not yet synced"))?;
//!
//! // Pull the plug: seed 7 decides which unflushed cache lines reached the media.
//! let image = heap.simulator().unwrap().crash(7);
//! let heap = Heap::open_image(image, &config)?;
//! let found = heap.collect(ScanFilter::all().owner(owner))?;
//! assert_eq!(found.len(), 1); // a consistent prefix: the synced operation, not the other
//! assert_eq!(heap.read_payload(found[0].block)?, b"acknowledged");
//! # Ok::<(), montage_core::Error>(())
//! ```

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(test, allow(clippy::unwrap_used))]
#![doc(test(attr(deny(warnings))))]
// `Error` has drop glue (it can hold an `io::Error` and a path), so an error built eagerly for
// `ok_or` is dropped on every success; on the allocation path that was 14% of the time.
// Errors are therefore built lazily, which this lint would undo.
#![allow(clippy::unnecessary_lazy_evaluations)]

mod alloc;
mod config;
mod epoch;
mod error;
mod heap;
mod payload;
mod persist;
mod primitive;
mod recovery;
mod slot;

pub use alloc::AllocStats;
pub use alloc::block::{BlockInfo, BlockKind, BlockSpec, OwnerId, PBlock};
pub use config::{BackendKind, DEFAULT_HEAP_SIZE, HeapConfig, WriteBack};
pub use epoch::EpochLength;
pub use epoch::op::OpGuard;
pub use error::{Error, Result};
pub use heap::layout::{
    DIRECTORY_CAPACITY, HEADER_LEN, MAX_HEAP_SIZE, MIN_HEAP_SIZE, NAME_MAX, REGISTRY_CAPACITY,
    SPAN_SIZE,
};
pub use heap::{Heap, INITIAL_EPOCH, ScanFilter};
pub use payload::cas::{CasError, CasErrorKind, CasWord, VerifiedAtomic};
pub use payload::codec::Codec;
pub use payload::fingerprint::Fingerprint;
pub use payload::list::{MAX_LIST_VALUE, VerifiedList};
pub use payload::queue::VerifiedQueue;
pub use payload::{CasField, POff, PRef, Payload, PayloadField};
pub use persist::harness::{
    Crashed, Ended, SyncRecord, check_synced, crash_generation, run_against_clock, run_with_clock,
};
pub use persist::sim::{CrashImage, SimMode, Simulator, SplitMix64, crash_seeds, for_each_seed};
pub use persist::{CACHE_LINE, PAGE_SIZE};
pub use recovery::{BlockView, RecoveryReport, Verdict};

/// What `#[derive(Payload)]` expands to. Not part of the API: no semver promise.
#[doc(hidden)]
pub mod __private {
    pub use crate::payload::access::{cas_field, get_field, set_field};
    pub use crate::payload::codec::encode_payload;
    pub use zerocopy;

    /// Writes `value` into `out` at byte `offset` (a payload's field, during
    /// [`PayloadField::write_field`](crate::PayloadField::write_field)).
    ///
    /// # Panics
    ///
    /// If the field does not lie inside `out`.
    pub fn write_at<F: crate::PayloadField>(out: &mut [u8], offset: usize, value: &F) {
        value.write_field(&mut out[offset..offset + size_of::<F>()]);
    }

    /// Reads the `F` at byte `offset` of `bytes`; `None` if it lies outside or is invalid.
    pub fn read_at<F: crate::PayloadField>(bytes: &[u8], offset: usize) -> Option<F> {
        F::read_field(bytes.get(offset..offset.checked_add(size_of::<F>())?)?)
    }
}
